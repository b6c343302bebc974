"""Changing a FLUX flavor's sizes from a recipe: the same double- and single-stream blocks, narrower and shallower."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from titanpod.models.flux import FluxArgs


@dataclass(frozen=True)
class FluxShape:
    """Sizes that replace the FLUX flavor's; every field left ``None`` keeps the flavor's value.

    Everything else (guidance embedding, biases, MLP ratio, RoPE base, timestep width, norms) stays the
    flavor's, so a small shape runs the same arithmetic as the published transformer.
    """

    dim: int | None = None
    """Hidden (model) width; must equal ``n_heads x head_dim``."""
    n_heads: int | None = None
    """Attention heads."""
    head_dim: int | None = None
    """Width of one head; must equal the sum of ``axes_dims``."""
    axes_dims: tuple[int, ...] | None = None
    """Rotary widths of the position id axes (index, row, column)."""
    depth: int | None = None
    """Double-stream blocks."""
    depth_single: int | None = None
    """Single-stream blocks."""
    context_dim: int | None = None
    """Width of the T5 states fed in: the text encoders' width."""
    pooled_dim: int | None = None
    """Width of the pooled CLIP vector fed in: the text encoders' width."""

    def __post_init__(self) -> None:
        if self.axes_dims is not None:  # a recipe file holds a list
            object.__setattr__(self, "axes_dims", tuple(self.axes_dims))

    def changed(self) -> dict[str, object]:
        """The sizes this shape sets, by field name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def apply(self, args: FluxArgs) -> FluxArgs:
        """``args`` with this shape's sizes; ``ValueError`` (naming ``model.shape``) when they do not fit together."""
        try:
            return dataclasses.replace(args, **self.changed())
        except ValueError as error:
            raise ValueError(f"model.shape: {error}") from error
