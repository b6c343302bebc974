"""RMSNorm: statistics in fp32, the result in the input's dtype."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned per-channel scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` over its last dim in fp32, then scale it in ``x``'s dtype.

        In fp32, and wherever the weight has ``x``'s dtype, this is Llama's and Qwen's norm bit for bit. A bf16
        input under a fp32 weight (Qwen 3's per-head norms under autocast) gives bf16 where their ``weight *
        normed`` would widen the result to fp32 and every op after it to twice the bytes."""
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(x.dtype) * normed.to(x.dtype)
