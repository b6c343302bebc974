"""The grouped matmul's tiles and its tiled call of megablox ``gmm``, importing only JAX.

Legend: E experts (groups), T rows of all groups, I input width, O output width.

``titanpod.kernels.grouped_matmul`` runs it as a PyTorch op over fixed-size expert buffers; this module
builds it so that it also builds where no PyTorch is installed (``tools/bench/pallas_on_tpu.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


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
    """Run Pallas in interpret mode; ``None`` does so unless the tensors are on a TPU (see ``pallas_interpret``)."""


def tiled_gmm(config: GroupedMatmulConfig, interpret: bool) -> Any:
    """``gmm(x_TI, w_EOI, sizes_E)``: rows ``x_TI`` (T a multiple of ``config.tile_rows``) in E consecutive groups
    of ``sizes_E`` rows (int32, summing to at most T; rows past them, of no group, come out zero), each group
    times its weight's transpose, [T, O]; differentiable (megablox's ``tgmm`` gives the weight gradient). Tile
    widths are the largest divisors of I and O up to the configured ones."""
    from jax.experimental.pallas.ops.tpu.megablox import ops

    def gmm(x_TI: Any, w_EOI: Any, sizes_E: Any) -> Any:
        _, O, I = w_EOI.shape  # noqa: E741 - I: legend
        tiling = (config.tile_rows, math.gcd(I, config.tile_in), math.gcd(O, config.tile_out))
        # positional: preferred dtype, tiling, group_offset, existing_out, transpose_rhs, interpret
        return ops.gmm(x_TI, w_EOI, sizes_E, x_TI.dtype, tiling, None, None, True, interpret)

    return gmm
