"""torch_tpu's own Splash attention (``torch.tpu.ops.splash_sdpa``) in the ``AttentionOp`` slot.

Legend: B batch, H query heads, K key/value heads, S sequence, D head dim.

The tpu lane only: it takes tensors on the ``tpu`` device. It has the same causal and local masks
as ``SplashAttention`` (window ``w``: each query sees itself and the ``w`` keys before it) and the
same ``1/sqrt(D)`` scale, but no document (segment) mask: packed documents need ``splash``. Key
and value heads are repeated to the query heads inside torch_tpu (its GQA path).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from titanpod.kernels.splash import SplashConfig, splash_tiles


@dataclass(frozen=True)
class TorchTpuSplashAttention:
    """Callable with the ``AttentionOp`` signature, backed by ``torch.tpu.ops.splash_sdpa``."""

    config: SplashConfig = field(default_factory=SplashConfig)
    """Tiles (capped at the sequence length) and the local window; ``interpret`` does not apply."""

    def __call__(
        self,
        q_BHSD: torch.Tensor,
        k_BKSD: torch.Tensor,
        v_BKSD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal (or local) GQA attention [B, H, S, D] on the TPU."""
        if document_ids_BS is not None:
            raise ValueError(
                "kernels.attention 'splash_sdpa' (torch_tpu's kernel) has no document mask; use kernels.attention "
                "'splash' for packed documents (data.document_masking)."
            )
        if q_BHSD.device.type != "tpu":
            raise ValueError(
                f"kernels.attention 'splash_sdpa' is torch_tpu's kernel and runs on the tpu lane only (got tensors "
                f"on {q_BHSD.device}); use 'splash', the same kernel through JAX, on other lanes."
            )
        import torch_tpu  # noqa: F401 - provides torch.tpu

        block_q, block_kv = splash_tiles(self.config, q_BHSD.shape[2])
        return torch.tpu.ops.splash_sdpa(  # type: ignore[attr-defined]
            q_BHSD, k_BKSD, v_BKSD,
            is_causal=True, local_window_size=self.config.window, enable_gqa=q_BHSD.shape[1] != k_BKSD.shape[1],
            block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
            block_dkv=block_kv, block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
            block_q_dq=block_q, block_kv_dq=block_kv,
        )  # fmt: skip
