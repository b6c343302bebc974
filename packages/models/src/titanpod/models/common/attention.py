"""Grouped-query self-attention with rotary embeddings; the core op is a slot.

Legend: B batch, S sequence, M model dim, H query heads, K key/value heads, D head dim.
"""

from __future__ import annotations

import torch
from torch import nn

from titanpod.models.common.args import DecoderArgs
from titanpod.models.common.kv_cache import KVCache, cached_attention
from titanpod.models.common.norms import RMSNorm
from titanpod.models.common.ops import AttentionOp
from titanpod.models.common.rope import apply_rotary


class Attention(nn.Module):
    """Project to heads, optionally RMSNorm each head (Qwen 3), rotate, attend, project back."""

    def __init__(self, args: DecoderArgs, attention_op: AttentionOp) -> None:
        super().__init__()
        self.head_dim = args.resolved_head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, args.norm_eps) if args.qk_norm else None
        self.attention_op = attention_op

    def _project(
        self, x_BSM: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries [B, H, S, D], rotated keys [B, K, S, D] and values [B, K, S, D] of ``x_BSM``."""
        B, S, _ = x_BSM.shape
        # Head counts come from the projections' widths, so the same code runs on a tensor-
        # parallel shard that holds only some of the heads.
        q_BSHD = self.wq(x_BSM).view(B, S, -1, self.head_dim)
        k_BSKD = self.wk(x_BSM).view(B, S, -1, self.head_dim)
        v_BKSD = self.wv(x_BSM).view(B, S, -1, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q_BSHD, k_BSKD = self.q_norm(q_BSHD), self.k_norm(k_BSKD)
        q_BHSD = apply_rotary(q_BSHD.transpose(1, 2), cos, sin)
        k_BKSD = apply_rotary(k_BSKD.transpose(1, 2), cos, sin)
        return q_BHSD, k_BKSD, v_BKSD

    def forward(
        self,
        x_BSM: torch.Tensor,
        cos_SD: torch.Tensor,
        sin_SD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend over ``x_BSM`` causally (and within documents when ``document_ids_BS`` is given)."""
        B, S, _ = x_BSM.shape
        q_BHSD, k_BKSD, v_BKSD = self._project(x_BSM, cos_SD, sin_SD)
        if document_ids_BS is None:  # the op as it was called before document masking: unchanged
            out_BHSD = self.attention_op(q_BHSD, k_BKSD, v_BKSD)
        else:
            out_BHSD = self.attention_op(q_BHSD, k_BKSD, v_BKSD, document_ids_BS)
        return self.wo(out_BHSD.transpose(1, 2).reshape(B, S, -1))

    def forward_with_cache(
        self,
        x_BSM: torch.Tensor,
        cos_B1SD: torch.Tensor,
        sin_B1SD: torch.Tensor,
        cache: KVCache,
        layer: int,
        positions_BS: torch.Tensor,
        end: int,
    ) -> torch.Tensor:
        """Attend new tokens at absolute ``positions_BS`` over this layer's cache, after writing theirs into it.

        ``cos_B1SD``/``sin_B1SD`` are the rotary angles of those positions; ``end`` bounds the
        cache positions read (the largest position in ``positions_BS`` plus one, or more).
        """
        B, S, _ = x_BSM.shape
        q_BHSD, k_BKSD, v_BKSD = self._project(x_BSM, cos_B1SD, sin_B1SD)
        k_BKTD, v_BKTD = cache.write(layer, k_BKSD, v_BKSD, positions_BS, end)
        # An attention op may bring its own form over a cache (``MathAttention.with_cache``); else SDPA's.
        over_cache = getattr(self.attention_op, "with_cache", cached_attention)
        out_BHSD = over_cache(q_BHSD, k_BKTD, v_BKTD, positions_BS)
        return self.wo(out_BHSD.transpose(1, 2).reshape(B, S, -1))
