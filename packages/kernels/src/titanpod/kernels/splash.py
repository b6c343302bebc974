"""Splash attention (JAX's Pallas TPU kernel) behind the model's attention slot.

Legend: B batch, H query heads, K key/value heads, G query heads per key/value head,
S sequence, D head dim.

The kernel runs per (batch, kv head) with the G query heads of that group (its MQA
form), under ``jax.vmap``; off a TPU it runs in Pallas interpret mode. One op is
registered per distinct (S, G, D, dtype, with or without document ids) the model meets.
Document ids (packed sequences) become the kernel's segment ids: its static mask (causal
or local) is and-ed with "same segment", one row of ids per batch element. On the xla
lane's mesh the kernel runs per shard: batch over the data axes, heads over ``tp`` when
it divides both head counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from titanpod.kernels.jax_op import JaxOp, free_op_name, jax_op, pallas_interpret
from titanpod.kernels.mesh_split import batch_axes, head_axis
from titanpod.models import document_causal_mask

LANES = 128
"""Splash attention's tiles are whole multiples of the TPU's 128 lanes."""


@dataclass(frozen=True)
class SplashConfig:
    """Splash attention's mask and tiles."""

    block_q: int = 512
    """Query rows per tile (capped at the sequence length)."""
    block_kv: int = 512
    """Key/value rows per tile (capped at the sequence length)."""
    window: int | None = None
    """Local attention: each query sees itself and the ``window`` keys before it; ``None`` is plain causal."""
    interpret: bool | None = None
    """Run Pallas in interpret mode; ``None`` does so unless the tensors are on a TPU (see ``pallas_interpret``)."""


def splash_tiles(config: SplashConfig, S: int) -> tuple[int, int]:
    """``(block_q, block_kv)`` for a sequence of ``S``: the configured tiles capped at ``S``; ``ValueError``
    where the kernel cannot tile it (tiles must be multiples of ``LANES`` and divide ``S``)."""
    block_q, block_kv = min(config.block_q, S), min(config.block_kv, S)
    if S % block_q or S % block_kv or block_q % LANES or block_kv % LANES:
        raise ValueError(
            f"Splash attention needs tiles that are multiples of {LANES} and a sequence ({S}) that is a "
            f"multiple of its tiles (block_q={block_q}, block_kv={block_kv}); change data.seq_len or "
            "kernels.splash's block sizes, or use attention 'sdpa'."
        )
    return block_q, block_kv


@dataclass
class SplashAttention:
    """Callable with the ``AttentionOp`` signature: causal (optionally local) GQA attention,
    kept within packed documents when given document ids (the kernel's segment ids)."""

    config: SplashConfig = field(default_factory=SplashConfig)
    """Mask and tiles."""
    _ops: dict[tuple[Any, ...], JaxOp] = field(default_factory=dict, repr=False)

    def _op(self, S: int, G: int, D: int, dtype: torch.dtype, documents: bool, device: torch.device) -> JaxOp:
        interpret = pallas_interpret(self.config.interpret, device)
        key = (S, G, D, dtype, documents, interpret)
        if key not in self._ops:
            name = free_op_name(f"splash_{S}_{G}_{D}_{str(dtype).split('.')[-1]}{'_documents' if documents else ''}")
            self._ops[key] = jax_op(name, self._kernel(S, G, D, documents, interpret), shard=_per_shard)
        return self._ops[key]

    def _kernel(self, S: int, G: int, D: int, documents: bool, interpret: bool) -> Any:
        import jax
        from jax.experimental.pallas.ops.tpu import splash_attention as splash

        block_q, block_kv = splash_tiles(self.config, S)
        if self.config.window is None:
            head_mask = splash.CausalMask((S, S))
        else:
            head_mask = splash.LocalMask((S, S), window_size=(self.config.window, 0), offset=0)
        tiles = splash.BlockSizes(
            block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
            block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
            block_q_dq=block_q, block_kv_dq=block_kv,
        )  # fmt: skip
        # The kernel is built once and reused by every later trace (jit, grad, remat): its mask tables
        # must be concrete arrays, not values of whichever trace happened to build it first.
        with jax.ensure_compile_time_eval():
            kernel = splash.make_splash_mqa_single_device(
                mask=splash.MultiHeadMask([head_mask] * G), block_sizes=tiles, interpret=interpret
            )

        def attention(q_BHSD: Any, k_BKSD: Any, v_BKSD: Any) -> Any:
            B, K = k_BKSD.shape[:2]
            q_BKGSD = (q_BHSD * (D**-0.5)).astype(q_BHSD.dtype).reshape(B, K, G, S, D)
            out_BKGSD = jax.vmap(jax.vmap(kernel))(q_BKGSD, k_BKSD, v_BKSD)
            return out_BKGSD.reshape(B, K * G, S, D)

        def attention_in_documents(q_BHSD: Any, k_BKSD: Any, v_BKSD: Any, ids_BS: Any) -> Any:
            B, K = k_BKSD.shape[:2]
            q_BKGSD = (q_BHSD * (D**-0.5)).astype(q_BHSD.dtype).reshape(B, K, G, S, D)
            segments = splash.SegmentIds(q=ids_BS, kv=ids_BS)  # each leaf [B, S]; one row per kernel call
            per_kv_head = jax.vmap(kernel, in_axes=(0, 0, 0, None))  # every kv head of a row: that row's ids
            out_BKGSD = jax.vmap(per_kv_head)(q_BKGSD, k_BKSD, v_BKSD, segments)
            return out_BKGSD.reshape(B, K * G, S, D)

        return attention_in_documents if documents else attention

    def __call__(
        self,
        q_BHSD: torch.Tensor,
        k_BKSD: torch.Tensor,
        v_BKSD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal (or local) GQA attention [B, H, S, D]; with ``document_ids_BS``, only within each document."""
        B, H, S, D = q_BHSD.shape
        K = k_BKSD.shape[1]
        if H % K:
            raise ValueError(f"Splash attention needs query heads ({H}) to be a multiple of key/value heads ({K}).")
        if q_BHSD.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"Splash attention runs in float32 or bfloat16, not {q_BHSD.dtype}.")
        if document_ids_BS is None:
            return self._op(S, H // K, D, q_BHSD.dtype, False, q_BHSD.device)(q_BHSD, k_BKSD, v_BKSD)
        if tuple(document_ids_BS.shape) != (B, S) or document_ids_BS.is_floating_point():
            raise ValueError(
                f"Splash attention needs integer document ids of shape [{B}, {S}] (one per token), "
                f"got {document_ids_BS.dtype} {list(document_ids_BS.shape)}."
            )
        # The kernel's segment ids are int32; ids relative to each row's smallest keep "same document" exact.
        ids_BS = (document_ids_BS - document_ids_BS.amin(dim=1, keepdim=True)).to(torch.int32)
        return self._op(S, H // K, D, q_BHSD.dtype, True, q_BHSD.device)(q_BHSD, k_BKSD, v_BKSD, ids_BS)


def _per_shard(fn: Any, mesh: Any, q_BHSD: Any, k_BKSD: Any, _v_BKSD: Any, *ids_BS: Any) -> Any:
    """``fn`` under ``jax.shard_map`` on ``mesh``: batch over the data axes, heads over tp when it
    divides them; an axis that divides neither leaves every shard the whole of that dimension."""
    import jax
    from jax.sharding import PartitionSpec as P

    batch = batch_axes(mesh, q_BHSD.shape[0])
    heads = head_axis(mesh, q_BHSD.shape[1], k_BKSD.shape[1])
    rows_HSD = P(batch, heads, None, None)
    in_specs = (rows_HSD, rows_HSD, rows_HSD) + ((P(batch, None),) if ids_BS else ())
    # check_vma=False: Pallas outputs carry no record of which mesh axes they vary over.
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=rows_HSD, check_vma=False)


def local_causal_sdpa(window: int):
    """Reference for local attention: SDPA with an explicit band mask (query i sees keys i-window..i).

    The returned op has the ``AttentionOp`` signature; given ``document_ids_BS`` it also keeps
    each query within its own document (band and same document).
    """

    def attention(
        q_BHSD: torch.Tensor,
        k_BKSD: torch.Tensor,
        v_BKSD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> torch.Tensor:
        S = q_BHSD.shape[2]
        i = torch.arange(S, device=q_BHSD.device)
        band_SS = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - window)
        # With ids: [B, 1, S, S], the band and the document mask.
        mask = band_SS if document_ids_BS is None else band_SS & document_causal_mask(document_ids_BS)
        return torch.nn.functional.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, attn_mask=mask, enable_gqa=True)

    return attention
