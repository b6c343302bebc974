"""Pieces of the FLUX.1 transformer: sinusoidal embeddings, 3-axis RoPE, modulation helpers, MLPs.

Legend: B batch, N tokens of one stream, S joint sequence (text then image), M model dim,
H heads, D head dim, A position id axes (3: index, row, column), F sinusoid channels,
I input width.

RoPE here rotates adjacent pairs (2i, 2i + 1) of each head, the layout FLUX was trained
in; the head's pairs are split among the axes by ``axes_dims`` (index axis first). The
angles are computed per forward from integer position ids, so the model keeps no buffers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

TIMESTEP_SCALE = 1000.0
"""FLUX feeds ``t x 1000`` (t in [0, 1]) and ``guidance x 1000`` to the sinusoidal embedding."""
MAX_PERIOD = 10000.0
"""Longest period of the sinusoidal timestep embedding."""


def timestep_embedding(t_B: torch.Tensor, channels: int, max_period: float = MAX_PERIOD) -> torch.Tensor:
    """Sinusoidal embedding [B, F] of (already scaled) timesteps, cosines first, in fp32.

    Frequencies are ``max_period ** (-k / (F/2))`` for k = 0 .. F/2 - 1.
    """
    half = channels // 2
    exponents_F2 = (-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t_B.device)) / half
    angles_BF2 = t_B[:, None].float() * torch.exp(exponents_F2)[None, :]
    return torch.cat((torch.cos(angles_BF2), torch.sin(angles_BF2)), dim=-1)


def angle_dtype(device: torch.device) -> torch.dtype:
    """fp64 where the device computes it natively (CPU, CUDA), else fp32: rotary angles reach 100s of radians."""
    return torch.float64 if device.type in ("cpu", "cuda") else torch.float32


def axes_rotary_cos_sin(
    ids_SA: torch.Tensor, axes_dims: tuple[int, ...], theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [S, D/2] (fp32) of every rotary pair, axis by axis, for integer position ids [S, A].

    Axis a owns ``axes_dims[a] / 2`` consecutive pairs, with frequencies
    ``theta ** (-2k / axes_dims[a])``, turned by that token's id along the axis.
    """
    if ids_SA.ndim != 2 or ids_SA.shape[1] != len(axes_dims):
        raise ValueError(
            f"position ids have shape {list(ids_SA.shape)}; expected [tokens, {len(axes_dims)}] "
            f"(one id per token for each rotary axis, no batch dimension)."
        )
    dtype = angle_dtype(ids_SA.device)
    positions_SA = ids_SA.to(dtype)
    angles = []
    for axis, width in enumerate(axes_dims):
        inv_freq = 1.0 / (theta ** (torch.arange(0, width, 2, dtype=dtype, device=ids_SA.device) / width))
        angles.append(positions_SA[:, axis, None] * inv_freq[None, :])
    angles_SD2 = torch.cat(angles, dim=-1)
    return angles_SD2.cos().float(), angles_SD2.sin().float()


def apply_pair_rotary(x_BHSD: torch.Tensor, cos_SD2: torch.Tensor, sin_SD2: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair (x[2i], x[2i + 1]) by its angle, in fp32; returns ``x``'s dtype."""
    pairs = x_BHSD.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos_SD2 - odd * sin_SD2, odd * cos_SD2 + even * sin_SD2), dim=-1)
    return rotated.flatten(-2).to(x_BHSD.dtype)


def layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last axis with no learned scale or shift, computed in fp32."""
    return F.layer_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def modulate(x_BNM: torch.Tensor, shift_BM: torch.Tensor, scale_BM: torch.Tensor) -> torch.Tensor:
    """Adaptive norm's affine step: ``x x (1 + scale) + shift``, one scale and shift per sample."""
    return x_BNM * (1 + scale_BM[:, None]) + shift_BM[:, None]


class MLPEmbedder(nn.Module):
    """Linear, SiLU, linear: embeds a timestep, a guidance scale or the pooled text vector."""

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.in_layer = nn.Linear(in_dim, dim)
        self.out_layer = nn.Linear(dim, dim)

    def forward(self, x_BI: torch.Tensor) -> torch.Tensor:
        """[B, I] -> [B, M]."""
        return self.out_layer(F.silu(self.in_layer(x_BI)))


class MLP(nn.Module):
    """The blocks' feed-forward: linear up, tanh-approximated GELU, linear down."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim)
        self.w2 = nn.Linear(hidden_dim, dim)

    def forward(self, x_BNM: torch.Tensor) -> torch.Tensor:
        """[B, N, M] -> [B, N, M]."""
        return self.w2(F.gelu(self.w1(x_BNM), approximate="tanh"))
