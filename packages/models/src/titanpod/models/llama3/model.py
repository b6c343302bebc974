"""Llama 3 in plain single-device PyTorch.

Legend: B batch, S sequence, M model dim, H query heads, K key/value heads, D head dim,
F feed-forward dim, V vocabulary.

Build on the meta device, move with ``to_empty``, then ``init_weights``. Parallelism,
kernels and compilation are applied from outside; the swappable ops arrive as ``ModelOps``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from titanpod.models.common.counting import decoder_flops_per_token, parameter_count
from titanpod.models.common.norms import RMSNorm
from titanpod.models.common.ops import AttentionOp, ModelOps
from titanpod.models.common.rope import apply_rotary, inverse_frequencies, rotary_cos_sin
from titanpod.models.llama3.args import Llama3Args


class Attention(nn.Module):
    """Grouped-query self-attention with rotary embeddings; the core op is a slot."""

    def __init__(self, args: Llama3Args, attention_op: AttentionOp) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.resolved_head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.attention_op = attention_op

    def forward(self, x_BSM: torch.Tensor, cos_SD: torch.Tensor, sin_SD: torch.Tensor) -> torch.Tensor:
        B, S, _ = x_BSM.shape
        q_BHSD = self.wq(x_BSM).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        k_BKSD = self.wk(x_BSM).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v_BKSD = self.wv(x_BSM).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q_BHSD = apply_rotary(q_BHSD, cos_SD, sin_SD)
        k_BKSD = apply_rotary(k_BKSD, cos_SD, sin_SD)
        out_BHSD = self.attention_op(q_BHSD, k_BKSD, v_BKSD)
        return self.wo(out_BHSD.transpose(1, 2).reshape(B, S, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)

    def forward(self, x_BSM: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x_BSM)) * self.w3(x_BSM))


class TransformerBlock(nn.Module):
    """Pre-norm block: attention then feed-forward, each with a residual."""

    def __init__(self, args: Llama3Args, ops: ModelOps) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, ops.attention)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_dim)

    def forward(self, x_BSM: torch.Tensor, cos_SD: torch.Tensor, sin_SD: torch.Tensor) -> torch.Tensor:
        h_BSM = x_BSM + self.attention(self.attention_norm(x_BSM), cos_SD, sin_SD)
        return h_BSM + self.feed_forward(self.ffn_norm(h_BSM))


class Llama3(nn.Module):
    """A Llama 3 decoder. ``forward`` gives logits; ``loss`` goes through the head-loss slot."""

    def __init__(self, args: Llama3Args, ops: ModelOps | None = None) -> None:
        super().__init__()
        self.args = args
        self.ops = ops or ModelOps()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, self.ops) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        # A tied model has no output layer of its own: the head reads the embedding table, so
        # no two parameters alias (aliases break under to_empty, sharding and safetensors).
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)

    @property
    def head_weight(self) -> torch.Tensor:
        """The output projection, [V, M]: the embedding table when embeddings are tied."""
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    def hidden_states(self, tokens_BS: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states, shape [B, S, M]."""
        h_BSM = self.tok_embeddings(tokens_BS)
        positions_S = torch.arange(tokens_BS.shape[1], device=tokens_BS.device)
        inv_freq = inverse_frequencies(self.args.resolved_head_dim, self.args.rope_theta, self.args.rope_scaling)
        cos_SD, sin_SD = rotary_cos_sin(positions_S, inv_freq, h_BSM.dtype)
        for layer in self.layers:
            h_BSM = layer(h_BSM, cos_SD, sin_SD)
        return self.norm(h_BSM)

    def forward(self, tokens_BS: torch.Tensor) -> torch.Tensor:
        """Next-token logits, shape [B, S, V]."""
        return F.linear(self.hidden_states(tokens_BS), self.head_weight)

    def loss(self, tokens_BS: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy against ``labels_BS`` (``IGNORE_INDEX`` skipped)."""
        return self.ops.head_loss(self.hidden_states(tokens_BS), self.head_weight, labels_BS)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Initialise every parameter in place from ``seed``, on whatever device it lives.

        Embeddings and projections get a normal of std 0.02 truncated at 3 std, the
        projections into the residual stream (``wo``, ``w2``) shrunk by ``1/sqrt(2 x n_layers)``;
        norm scales are one. The same seed gives the same weights on every device type.
        """
        generator = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.args.n_layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            std = residual_std if name.endswith(("wo.weight", "w2.weight")) else 0.02
            values = torch.empty(param.shape).normal_(0.0, std, generator=generator)
            param.copy_(values.clamp_(-3 * std, 3 * std))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 x (parameters but the input embedding) + attention.

        See ``titanpod.models.common.counting.decoder_flops_per_token`` for the convention.
        """
        input_table = 0 if self.args.tie_embeddings else self.tok_embeddings.weight.numel()
        return decoder_flops_per_token(
            matmul_params=parameter_count(self) - input_table,
            n_layers=self.args.n_layers,
            n_heads=self.args.n_heads,
            head_dim=self.args.resolved_head_dim,
            seq_len=seq_len,
        )
