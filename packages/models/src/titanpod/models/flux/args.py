"""Shape and numerics of the FLUX.1 transformer, and its named flavors.

Legend: C image channels (patched latents), M model dim, H heads, D head dim, P pooled
text width, X context (T5) width.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FluxArgs:
    """Everything that fixes a FLUX.1 transformer's parameters and arithmetic."""

    in_channels: int = 64
    """Channels of one image token: 16 latent channels x a 2 x 2 patch."""
    out_channels: int | None = None
    """Channels of one predicted token; ``None`` means ``in_channels``."""
    dim: int = 3072
    """Hidden (model) width; equals ``n_heads x head_dim``."""
    n_heads: int = 24
    """Attention heads."""
    head_dim: int = 128
    """Width of one head; equals ``sum(axes_dims)``."""
    depth: int = 19
    """Double-stream blocks (text and image keep their own weights, attend jointly)."""
    depth_single: int = 38
    """Single-stream blocks (one weight set over the joined text and image tokens)."""
    mlp_ratio: float = 4.0
    """Hidden width of every MLP as a multiple of ``dim``."""
    context_dim: int = 4096
    """Width of the text tokens fed in (T5-XXL encoder states)."""
    pooled_dim: int = 768
    """Width of the pooled text vector fed in (CLIP-L pooled output)."""
    axes_dims: tuple[int, ...] = (16, 56, 56)
    """Rotary widths of the position id axes (index, row, column); they sum to ``head_dim``."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies, the same on every axis."""
    guidance_embed: bool = False
    """Embed a guidance scale like the timestep (FLUX.1 dev, guidance-distilled); schnell has none."""
    qkv_bias: bool = True
    """Double-stream blocks' q/k/v projections carry a bias (they do in the public model); the
    single-stream blocks' fused linear always does."""
    time_channels: int = 256
    """Width of the sinusoidal timestep (and guidance) embedding before its MLP."""
    norm_eps: float = 1e-6
    """Epsilon of every LayerNorm and of the query/key RMSNorms."""

    def __post_init__(self) -> None:
        if self.n_heads * self.head_dim != self.dim:
            raise ValueError(f"dim ({self.dim}) must equal n_heads x head_dim ({self.n_heads} x {self.head_dim}).")
        if sum(self.axes_dims) != self.head_dim:
            raise ValueError(f"axes_dims {tuple(self.axes_dims)} must sum to head_dim ({self.head_dim}).")
        if any(width % 2 for width in self.axes_dims):
            raise ValueError(f"every entry of axes_dims {tuple(self.axes_dims)} must be even (rotary pairs).")
        if self.time_channels % 2:
            raise ValueError(f"time_channels ({self.time_channels}) must be even (cosines and sines).")

    @property
    def resolved_out_channels(self) -> int:
        """Channels of one predicted token."""
        return self.in_channels if self.out_channels is None else self.out_channels

    @property
    def mlp_dim(self) -> int:
        """Hidden width of every MLP."""
        return int(self.dim * self.mlp_ratio)


_TWELVE_B = FluxArgs()

FLUX_FLAVORS: dict[str, FluxArgs] = {
    "debug": FluxArgs(
        in_channels=64,
        dim=64,
        n_heads=2,
        head_dim=32,
        depth=1,
        depth_single=1,
        context_dim=64,
        pooled_dim=32,
        axes_dims=(4, 14, 14),
        guidance_embed=True,
    ),
    "schnell": dataclasses.replace(_TWELVE_B, guidance_embed=False),
    "dev": dataclasses.replace(_TWELVE_B, guidance_embed=True),
}
"""Named FLUX.1 transformer shapes: ``debug`` (tiny, every code path, guidance included),
``schnell`` (12B, no guidance embedding) and ``dev`` (12B, guidance-distilled)."""


def flux_args_to_dict(args: FluxArgs) -> dict[str, Any]:
    """``args`` as plain JSON-able data (``flux_args_from_dict`` reverses it)."""
    data = dataclasses.asdict(args)
    data["axes_dims"] = list(args.axes_dims)
    return data


def flux_args_from_dict(data: dict[str, Any]) -> FluxArgs:
    """Rebuild ``FluxArgs`` from ``flux_args_to_dict`` output; unknown fields are an error naming them."""
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(FluxArgs)})
    if unknown:
        raise ValueError(f"Unknown FLUX args fields: {', '.join(unknown)}.")
    values = dict(data)
    if "axes_dims" in values:
        values["axes_dims"] = tuple(int(width) for width in values["axes_dims"])
    return FluxArgs(**values)
