"""AdamW's moments in host memory (``TrainConfig.optimizer_offload``), each held as pieces along its first axis.

The update brings the moments to the devices one piece at a time (``streamed_update``), so a device holds a piece's
worth, not a whole tensor's: a stack of every block's MLP matrix or a large vocabulary's embedding would otherwise be
brought in whole (Llama 3.2 1B: 268M elements, 5.6 GiB for its update on a 16 GiB chip). Each piece is its own array
in host memory, so splitting and joining them needs no work on the host; only a checkpoint's save and restore,
which speak of whole tensors, join and split them (``joined_pieces``, ``split_into_pieces``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

MOMENT_PIECE_BYTES = 256 * 2**20
"""The most bytes a device holds of one piece of one fp32 moment. A piece is a run of whole rows (first-axis slices),
so a tensor whose rows are each larger is split row by row; one whose first axis is sharded is not split."""

Rows = tuple[tuple[int, int], ...]
"""A tensor's pieces: each piece's first and past-last row, in order, covering the first axis."""


def piece_rows(shape: Sequence[int], sharding: Any, max_bytes: int = MOMENT_PIECE_BYTES) -> Rows:
    """The pieces an fp32 tensor of ``shape`` laid out as ``sharding`` is held in: runs of rows of at most
    ``max_bytes`` on a device, as even as the rows allow; one piece for a 0-d tensor, a single row, or a first axis
    split over devices (its share on each is then already a fraction)."""
    rows = shape[0] if shape else 1
    spec = tuple(getattr(sharding, "spec", ()))
    local = math.prod(sharding.shard_shape(tuple(shape))) if shape else 1
    pieces = piece_count(rows, local, first_axis_split=bool(spec) and spec[0] is not None, max_bytes=max_bytes)
    bounds = [rows * index // pieces for index in range(pieces + 1)]
    return tuple(itertools.pairwise(bounds))


def piece_count(rows: int, local_numel: int, first_axis_split: bool, max_bytes: int = MOMENT_PIECE_BYTES) -> int:
    """How many pieces ``piece_rows`` makes of a tensor of ``rows`` rows (its first axis) of which a device holds
    ``local_numel`` elements; ``first_axis_split``: that axis is split over devices (one piece then)."""
    if rows <= 1 or first_axis_split:
        return 1
    rows_a_piece = max(1, max_bytes // (4 * max(1, local_numel // rows)))
    return -(-rows // rows_a_piece)


def largest_piece_numel(
    rows: int, local_numel: int, first_axis_split: bool, max_bytes: int = MOMENT_PIECE_BYTES
) -> int:
    """Elements a device holds of the largest of ``piece_rows``'s pieces of such a tensor (see ``piece_count``)."""
    pieces = piece_count(rows, local_numel, first_axis_split, max_bytes)
    return -(-rows // pieces) * (local_numel // max(rows, 1)) if pieces > 1 else local_numel


def piece_shape(shape: Sequence[int], rows: tuple[int, int]) -> tuple[int, ...]:
    """The shape of the piece of a tensor of ``shape`` holding ``rows``."""
    return (rows[1] - rows[0], *shape[1:]) if shape else ()


def zero_pieces(shape: Sequence[int], rows: Rows, sharding: Any) -> list[Any]:
    """Zero fp32 pieces of a tensor of ``shape``, one per ``rows`` entry, each made in place as ``sharding`` says."""
    import jax
    import jax.numpy as jnp

    return [
        jax.jit(lambda piece=piece: jnp.zeros(piece_shape(shape, piece), jnp.float32), out_shardings=sharding)()
        for piece in rows
    ]


def joined_pieces(pieces: Sequence[Any], sharding: Any) -> Any:
    """The whole tensor from its ``pieces``, laid out as ``sharding`` (one jitted join; a single piece as it is)."""
    import jax
    import jax.numpy as jnp

    if len(pieces) == 1:
        return pieces[0]
    return jax.jit(lambda parts: jnp.concatenate(parts), out_shardings=sharding)(list(pieces))


def split_into_pieces(array: Any, rows: Rows, sharding: Any) -> list[Any]:
    """``array`` as its pieces (``rows``), each laid out as ``sharding``; copies, so ``array`` may be donated later."""
    import jax

    if len(rows) == 1:
        return [jax.device_put(array, sharding, may_alias=False)]
    return jax.jit(lambda whole: [whole[start:stop] for start, stop in rows], out_shardings=[sharding] * len(rows))(
        array
    )
