"""Causal GQA attention written out in plain PyTorch ops: scores, mask, softmax, weighted values.

Legend: B batch, H query heads, K key/value heads, D head dim, S sequence (queries), T keys.

It holds the whole [B, H, S, S] score matrix (fp32 for the softmax), so it costs memory that SDPA's
fused kernels do not; what it buys is that it needs no attention kernel at all. On the tpu lane,
torch_tpu sends ``scaled_dot_product_attention`` to a Pallas kernel that libtpu releases before 0.0.50
cannot compile (docs/tpu-chip.md); these matmuls, ``where`` and ``softmax`` lower like any other op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from titanpod.models import document_causal_mask


def causal_mask(
    S: int, device: torch.device, window: int | None = None, document_ids_BS: torch.Tensor | None = None
) -> torch.Tensor:
    """Which keys each query may see: [S, S] (query i sees keys i-window..i, every earlier one without a window),
    or [B, 1, S, S] within each packed document when given its ids."""
    i_S = torch.arange(S, device=device)
    allowed_SS = i_S[None, :] <= i_S[:, None]
    if window is not None:
        allowed_SS = allowed_SS & (i_S[None, :] >= i_S[:, None] - window)
    return allowed_SS if document_ids_BS is None else allowed_SS & document_causal_mask(document_ids_BS)


@dataclass(frozen=True)
class MathAttention:
    """Callable with the ``AttentionOp`` signature: causal (or local) GQA attention, kept within packed
    documents when given document ids; equal to ``sdpa_attention`` (and to the local SDPA reference)."""

    window: int | None = None
    """Keys before each query it may see (query i sees keys i-window..i); ``None``: every earlier key."""

    def __call__(
        self,
        q_BHSD: torch.Tensor,
        k_BKSD: torch.Tensor,
        v_BKSD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attended values [B, H, S, D]; H is a multiple of K."""
        allowed = causal_mask(q_BHSD.shape[2], q_BHSD.device, self.window, document_ids_BS)
        return masked_attention(q_BHSD, k_BKSD, v_BKSD, allowed)

    def with_cache(
        self, q_BHSD: torch.Tensor, k_BKTD: torch.Tensor, v_BKTD: torch.Tensor, positions_BS: torch.Tensor
    ) -> torch.Tensor:
        """New queries at absolute ``positions_BS`` over T cached keys and values (the decoding form, equal to
        ``titanpod.models.common.kv_cache.cached_attention``): [B, H, S, D]."""
        keys_T = torch.arange(k_BKTD.shape[2], device=q_BHSD.device)
        allowed_BST = keys_T[None, None, :] <= positions_BS[:, :, None]
        if self.window is not None:
            allowed_BST = allowed_BST & (keys_T[None, None, :] >= positions_BS[:, :, None] - self.window)
        return masked_attention(q_BHSD, k_BKTD, v_BKTD, allowed_BST.unsqueeze(1))


def masked_attention(
    q_BHSD: torch.Tensor, k_BKTD: torch.Tensor, v_BKTD: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """GQA attention of S queries over T keys where ``allowed`` ([S, T] or [B, 1, S, T]) is true, in plain ops;
    every query must be allowed at least one key (its own position)."""
    D = q_BHSD.shape[-1]
    groups = q_BHSD.shape[1] // k_BKTD.shape[1]
    k_BHTD = k_BKTD.repeat_interleave(groups, dim=1)
    v_BHTD = v_BKTD.repeat_interleave(groups, dim=1)
    scores_BHST = torch.matmul(q_BHSD, k_BHTD.transpose(-2, -1)).float() * D**-0.5
    scores_BHST = scores_BHST.masked_fill(~allowed, float("-inf"))
    weights_BHST = torch.softmax(scores_BHST, dim=-1).to(v_BHTD.dtype)
    return torch.matmul(weights_BHST, v_BHTD)
