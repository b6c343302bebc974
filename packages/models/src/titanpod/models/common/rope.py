"""Rotary position embeddings in the rotate-half layout (the Hugging Face one).

Legend: B batch, S sequence, H heads, D head dim.

The angles are computed per forward from positions, so a model needs no rotary buffers:
nothing to initialise after building on the meta device and nothing in checkpoints.
"""

from __future__ import annotations

import math

import torch

from titanpod.models.common.rope_scaling import Llama3RopeScaling


def inverse_frequencies(
    head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None, device: torch.device | None = None
) -> torch.Tensor:
    """The ``head_dim / 2`` rotary frequencies, with Llama 3.1 scaling when given.

    Computed in fp32, as the published reference implementations do, so angles match theirs.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    if scaling is not None:
        low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
        high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        in_between = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        inv_freq = torch.where(in_between, blended, inv_freq)
    return inv_freq


def rotary_cos_sin(
    positions_S: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [S, D] for the given positions (D = 2 x len(inv_freq))."""
    angles_SD2 = positions_S.float()[:, None] * inv_freq[None, :]
    angles_SD = torch.cat((angles_SD2, angles_SD2), dim=-1)
    return angles_SD.cos().to(dtype), angles_SD.sin().to(dtype)


def apply_rotary(x_BHSD: torch.Tensor, cos_SD: torch.Tensor, sin_SD: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + D/2) of every head by the position's angles.

    The pairs' swap, (-x[D/2:], x[:D/2]), is a product with a signed permutation (``half_turn``) rather than a
    concatenation of slices: on a TPU the slices move data across vector lanes (a profile of Qwen 3 0.6B on a v5e
    found them at a third of the memory bandwidth, 7% of the step), where the product runs on the matrix unit
    fused with its neighbours. Each output is one input times +-1, so the swap is exact in the product's own
    dtype: bit for bit in float32 and in 16-bit floats. Like every matmul of the run it follows the run's matmul
    precision: under bf16 autocast (or TF32, or a TPU's default precision) a float32 input's swapped half is
    rounded to bf16 (TF32) first, as the attention that follows rounds the whole of it. The angles are cast to
    ``x``'s dtype, as in a 16-bit model: float32 angles would widen 16-bit queries and keys to float32."""
    rotated = x_BHSD @ half_turn(x_BHSD.shape[-1], x_BHSD.dtype, x_BHSD.device)
    return x_BHSD * cos_SD.to(x_BHSD.dtype) + rotated * sin_SD.to(x_BHSD.dtype)


def half_turn(D: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The [D, D] matrix P with x @ P = (-x[D/2:], x[:D/2]): [[0, I], [-I, 0]]."""
    eye = torch.eye(D // 2, dtype=dtype, device=device)
    zeros = torch.zeros_like(eye)
    return torch.cat((torch.cat((zeros, eye), dim=1), torch.cat((-eye, zeros), dim=1)), dim=0)
