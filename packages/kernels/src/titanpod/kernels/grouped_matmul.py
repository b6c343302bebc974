"""Grouped matmul for MoE experts: JAX's megablox ``gmm`` (its ``tgmm`` gives the weight gradient).

Legend: E experts, C rows per expert (its capacity), T rows of all experts (E x C), I input
width, O output width.

Each expert's rows arrive as a fixed-size buffer (``ExpertMatmulOp``), so the groups are E
consecutive runs of C rows: sizes fixed by the shape, never read from the device. ``gmm``
needs the rows in whole tiles, so they are padded with rows of no group (which it leaves as
zeros) and cut back. Tile widths are the largest divisors of the matrix widths
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

    def __call__(self, x_ECI: torch.Tensor, w_EOI: torch.Tensor) -> torch.Tensor:
        """``x_ECI[e] @ w_EOI[e].T`` for every expert e, [E, C, O], as one grouped matmul over E x C rows."""
        if x_ECI.dtype != w_EOI.dtype or x_ECI.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"The grouped matmul takes float32 or bfloat16 inputs of one dtype, got {x_ECI.dtype} "
                            f"and {w_EOI.dtype}.")  # fmt: skip
        E, C, I = x_ECI.shape  # noqa: E741 - I is the legend's input width
        if w_EOI.shape[0] != E or w_EOI.shape[2] != I:
            raise ValueError(f"The grouped matmul takes rows [E, C, I] and weights [E, O, I] of one E and I, got "
                             f"{list(x_ECI.shape)} and {list(w_EOI.shape)}.")  # fmt: skip
        T = E * C
        padded = -T % self.config.tile_rows
        x_TI = x_ECI.reshape(T, I)
        x_PI = F.pad(x_TI, (0, 0, 0, padded)) if padded else x_TI
        sizes_E = torch.full((E,), C, dtype=torch.int32, device=x_ECI.device)
        out_PO = self._op(I, w_EOI.shape[1], x_ECI.dtype)(x_PI, w_EOI, sizes_E)
        return (out_PO[:T] if padded else out_PO).view(E, C, -1)
