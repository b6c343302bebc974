"""Parameter counts and model FLOPs, the numbers MFU and the planner are built on."""

from __future__ import annotations

from torch import nn


def parameter_count(model: nn.Module) -> int:
    """Number of distinct parameters (a tied weight counts once); works on the meta device."""
    return sum(p.numel() for p in model.parameters())


def decoder_flops_per_token(matmul_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> float:
    """Model FLOPs to train on one token of a decoder: forward and backward.

    ``6 x N + 12 x n_layers x n_heads x head_dim x seq_len``, where N counts the
    parameters used in matmuls (all but the input embedding lookup; a tied table counts
    once, as the output head; for MoE only the experts a token uses). The second term is
    attention scores and values, forward and backward, without halving for the causal
    mask and without recompute. MaxText halves the attention term for causal masks, so
    its MFU reads lower on long sequences.
    """
    return 6.0 * matmul_params + 12.0 * n_layers * n_heads * head_dim * seq_len
