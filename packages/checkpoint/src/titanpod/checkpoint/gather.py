"""One sharded parameter gathered whole on the writing process alone, each part sent once straight into place.

``DTensor.full_tensor`` makes the whole tensor on every rank (and, through its all-gather buffers, up to
twice over). To save, only the writer needs it: every rank says which region it holds, the lowest rank
holding each distinct region sends it to the writer (a point-to-point send), and the writer receives it
into its place in one output tensor: the writer holds the tensor once, plus at most ``PIECE_BYTES`` in
flight when a part is not a contiguous block of it (columns: it travels in pieces of rows); the other
ranks hold nothing beyond their shards.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

WRITER_RANK = 0
"""The global rank that writes shared files."""

PIECE_BYTES = 16 * 2**20
"""Largest piece of a part sent at once when the part is not a contiguous block of the whole."""


def _regions(param: DTensor) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(offset, shape) of the region each global rank holds, exchanged over the default group."""
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    mine = torch.tensor([*offset, *shape], dtype=torch.int64, device=param._local_tensor.device)
    every = torch.empty(dist.get_world_size() * mine.numel(), dtype=torch.int64, device=mine.device)
    dist.all_gather_into_tensor(every, mine)
    rows = every.view(dist.get_world_size(), 2, param.ndim).tolist()
    return [(tuple(row[0]), tuple(row[1])) for row in rows]


def _is_leading_block(shape: tuple[int, ...], whole: torch.Size) -> bool:
    """Whether a region of ``shape`` is a contiguous block of a contiguous tensor of shape ``whole``: it spans all
    of every dimension after the first."""
    return tuple(shape[1:]) == tuple(whole[1:])


def _pieces(shape: tuple[int, ...], itemsize: int) -> list[slice]:
    """Row ranges of a part of ``shape``, each at most ``PIECE_BYTES`` (or one row)."""
    rows = max(1, PIECE_BYTES // max(1, math.prod(shape[1:]) * itemsize))
    return [slice(start, min(start + rows, shape[0])) for start in range(0, shape[0], rows)]


def gather_to_writer(param: DTensor) -> torch.Tensor | None:
    """``param`` whole on the writer (``WRITER_RANK``), on its local device; ``None`` on every other rank.

    A collective: every rank of the default group calls it, for the same parameters in the same order.
    Parameters whose mesh does not span the whole group, or whose placements are not plain ``Shard`` and
    ``Replicate``, are gathered with ``full_tensor`` instead.
    """
    plain = all(type(placement) in (Shard, Replicate) for placement in param.placements)
    if not plain or param.device_mesh.size() != dist.get_world_size():
        whole = param.full_tensor()
        return whole if dist.get_rank() == WRITER_RANK else None
    local = param._local_tensor
    rank = dist.get_rank()
    out = torch.empty(param.shape, dtype=local.dtype, device=local.device) if rank == WRITER_RANK else None
    senders: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    for source, region in enumerate(_regions(param)):
        senders.setdefault(region, source)  # the lowest rank holding each region sends it
    for (offset, shape), source in senders.items():
        if 0 in shape:
            continue
        if rank == source == WRITER_RANK:
            assert out is not None
            out[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))].copy_(local)
        elif rank == source:
            if _is_leading_block(shape, param.shape):
                dist.send(local.contiguous(), WRITER_RANK)
            else:
                for rows in _pieces(shape, local.element_size()):
                    dist.send(local[rows].contiguous(), WRITER_RANK)
        elif rank == WRITER_RANK:
            assert out is not None
            place = out[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))]
            if _is_leading_block(shape, param.shape):
                dist.recv(place, source)  # straight into its place: a contiguous block of ``out``
                continue
            for rows in _pieces(shape, local.element_size()):
                piece = torch.empty(place[rows].shape, dtype=local.dtype, device=local.device)
                dist.recv(piece, source)
                place[rows].copy_(piece)
    return out
