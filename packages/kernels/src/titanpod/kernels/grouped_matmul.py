"""Grouped matmul for MoE experts: JAX's megablox ``gmm`` (its ``tgmm`` gives the weight gradient).

Legend: T routed rows, I input width, O output width, E experts.

``gmm`` needs the rows in whole tiles, so they are padded with rows of no group (which it
leaves as zeros) and cut back. Tile widths are the largest divisors of the matrix widths
up to the configured ones. Off a TPU, Pallas runs in interpret mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from titanpod.kernels.jax_op import JaxOp, jax_op


@dataclass(frozen=True)
class GroupedMatmulConfig:
    """Tiles of the grouped matmul."""

    tile_rows: int = 128
    """Rows per tile; rows are padded to a multiple of it."""
    tile_in: int = 128
    """Input-width tile (the largest divisor of the width up to this)."""
    tile_out: int = 128
    """Output-width tile (the largest divisor of the width up to this)."""
    interpret: bool | None = None
    """Run Pallas in interpret mode; ``None`` does so unless JAX's default backend is a TPU."""


@dataclass
class MegabloxGroupedMatmul:
    """Callable with the ``ExpertMatmulOp`` signature, backed by megablox ``gmm``."""

    config: GroupedMatmulConfig = field(default_factory=GroupedMatmulConfig)
    """Tiles."""
    _ops: dict[tuple[Any, ...], JaxOp] = field(default_factory=dict, repr=False)

    def _op(self, I: int, O: int, dtype: torch.dtype) -> JaxOp:  # noqa: E741 - I is the legend's input width
        key = (I, O, dtype)
        if key not in self._ops:
            import jax
            import jax.numpy as jnp
            from jax.experimental.pallas.ops.tpu.megablox import ops

            interpret = self.config.interpret if self.config.interpret is not None else jax.default_backend() != "tpu"
            tiling = (self.config.tile_rows, math.gcd(I, self.config.tile_in), math.gcd(O, self.config.tile_out))

            def grouped(x_TI: Any, w_EOI: Any, sizes_E: Any) -> Any:
                # positional: preferred dtype, tiling, group_offset, existing_out, transpose_rhs, interpret
                return ops.gmm(x_TI, w_EOI, sizes_E.astype(jnp.int32), x_TI.dtype, tiling, None, None, True, interpret)

            self._ops[key] = jax_op(f"gmm_{id(self)}_{I}_{O}_{str(dtype).split('.')[-1]}", grouped)
        return self._ops[key]

    def __call__(self, x_TI: torch.Tensor, w_EOI: torch.Tensor, group_sizes_E: torch.Tensor) -> torch.Tensor:
        if x_TI.dtype != w_EOI.dtype or x_TI.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"The grouped matmul takes float32 or bfloat16 inputs of one dtype, got {x_TI.dtype} "
                            f"and {w_EOI.dtype}.")  # fmt: skip
        T = x_TI.shape[0]
        padded = -T % self.config.tile_rows
        x_PI = F.pad(x_TI, (0, 0, 0, padded)) if padded else x_TI
        out = self._op(x_TI.shape[1], w_EOI.shape[1], x_TI.dtype)(x_PI, w_EOI, group_sizes_E.to(torch.int32))
        return out[:T] if padded else out
