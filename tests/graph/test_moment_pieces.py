"""How moments in host memory are cut into pieces (``titanpod.graph.xla.moment_pieces``): runs of whole rows of at most
the piece size on a device, as even as the rows allow, covering the tensor; one piece where the first axis is split
over devices; and the planner's largest piece is the largest piece the step makes."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest

from titanpod.graph.xla.moment_pieces import MOMENT_PIECE_BYTES, largest_piece_numel, piece_rows, piece_shape


@dataclass(frozen=True)
class Layout:
    """A sharding's two parts that the pieces read: its spec and each device's share of a shape."""

    spec: tuple
    ways: tuple[int, ...]

    def shard_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(-(-size // ways) for size, ways in zip(shape, self.ways, strict=True))


WHOLE = Layout((None, None), (1, 1))


@pytest.mark.parametrize(
    ("shape", "layout", "max_bytes"),
    [
        ((16, 8192, 2048), Layout((None, None, None), (1, 1, 1)), MOMENT_PIECE_BYTES),  # Llama 3.2 1B's MLP stack
        ((128256, 2048), WHOLE, MOMENT_PIECE_BYTES),  # its embedding
        ((151936, 1024), Layout((None, "fsdp"), (1, 4)), MOMENT_PIECE_BYTES),  # rows unsplit, columns over 4
        ((1000, 7), WHOLE, 4 * 7 * 3),  # three rows a piece at most
        ((5, 3), WHOLE, 4 * 3 + 8),  # a row and two thirds: one row a piece
        ((5, 10), WHOLE, 4),  # a row larger than a piece: one row a piece
    ],
)
def test_pieces_are_even_runs_of_rows_within_the_size_covering_the_tensor(shape, layout, max_bytes):
    rows = piece_rows(shape, layout, max_bytes)
    assert rows[0][0] == 0 and rows[-1][1] == shape[0]
    assert all(stop == start for (_, stop), (start, _) in itertools.pairwise(rows))
    sizes = [stop - start for start, stop in rows]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    row_bytes = 4 * math.prod(layout.shard_shape(shape)[1:])
    assert max(sizes) * row_bytes <= max_bytes or max(sizes) == 1
    assert len(rows) == 1 or -(-shape[0] // (len(rows) - 1)) * row_bytes > max_bytes  # no fewer would do
    largest = largest_piece_numel(shape[0], math.prod(layout.shard_shape(shape)), first_axis_split=False,
                                  max_bytes=max_bytes)  # fmt: skip
    assert largest == max(sizes) * math.prod(layout.shard_shape(shape)[1:])
    assert piece_shape(shape, rows[0]) == (sizes[0], *shape[1:])


def test_a_first_axis_split_over_devices_a_single_row_or_a_scalar_is_one_piece():
    assert piece_rows((8192, 2048), Layout(("fsdp", None), (4, 1)), 1024) == ((0, 8192),)
    assert piece_rows((1, 2048), WHOLE, 1024) == ((0, 1),)
    assert piece_rows((), Layout((), ()), 1024) == ((0, 1),)
    assert piece_shape((), (0, 1)) == ()
    assert largest_piece_numel(8192, 2048 * 2048, first_axis_split=True, max_bytes=1024) == 2048 * 2048


def test_the_llama_32_1b_update_comes_in_pieces_of_four_blocks():
    """Its largest stacked tensor, 16 blocks of 8192 x 2048 fp32 (1 GiB a moment), in 256 MiB pieces: 4 blocks each."""
    rows = piece_rows((16, 8192, 2048), Layout((None, None, None), (1, 1, 1)))
    assert rows == ((0, 4), (4, 8), (8, 12), (12, 16))
