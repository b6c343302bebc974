"""The dense SwiGLU feed-forward layer.

Legend: B batch, S sequence, M model dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)

    def forward(self, x_BSM: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x_BSM)) * self.w3(x_BSM))
