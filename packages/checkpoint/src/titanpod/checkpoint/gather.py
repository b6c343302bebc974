"""A sharded parameter gathered on the writing process alone, in row blocks, each part sent once straight into place.

``DTensor.full_tensor`` makes the whole tensor on every rank (and, through its all-gather buffers, up to
twice over). To save, only the writer needs it, and only one stretch of rows at a time: the tensor a slot
names (``HFSlot``: a whole parameter, one expert, a row range) is cut into row blocks of at most
``safetensors_stream.BLOCK_BYTES``; for each block, every distinct region some rank holds that overlaps
it is sent by the lowest rank holding that region (point to point) into its place in the block on the
writer. So the writer holds one block (plus, for a column shard, the piece in flight) and never a whole
tensor larger than a block; the other ranks hold their shards and at most the piece they send.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from titanpod.checkpoint.block_buffer import BlockBuffer
from titanpod.checkpoint.safetensors_stream import row_ranges
from titanpod.models.adapters import HFSlot

WRITER_RANK = 0
"""The global rank that writes shared files."""

Box = tuple[tuple[int, int], ...]
"""A region of a tensor: ``(start, stop)`` per dimension."""


def _regions(param: DTensor) -> list[Box]:
    """The region each global rank holds, exchanged over the default group."""
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    mine = torch.tensor([*offset, *shape], dtype=torch.int64, device=param._local_tensor.device)
    every = torch.empty(dist.get_world_size() * mine.numel(), dtype=torch.int64, device=mine.device)
    dist.all_gather_into_tensor(every, mine)
    rows = every.view(dist.get_world_size(), 2, param.ndim).tolist()
    return [tuple((o, o + s) for o, s in zip(row[0], row[1], strict=True)) for row in rows]


def _overlap(a: Box, b: Box) -> Box | None:
    """The region ``a`` and ``b`` share, or ``None`` when it is empty."""
    both = tuple((max(x[0], y[0]), min(x[1], y[1])) for x, y in zip(a, b, strict=True))
    return None if any(start >= stop for start, stop in both) else both


def _within(part: Box, region: Box) -> tuple[slice, ...]:
    """Index of ``part`` inside a tensor holding ``region``."""
    return tuple(slice(start - origin, stop - origin) for (start, stop), (origin, _) in zip(part, region, strict=True))


def slot_blocks(shape: tuple[int, ...], slot: HFSlot, itemsize: int) -> Iterator[tuple[Box, tuple[int, ...]]]:
    """The row blocks of the tensor ``slot`` names in a parameter of ``shape``: each block's region of the
    parameter and its shape as a piece of the slot's tensor (at most ``BLOCK_BYTES`` of ``itemsize`` each,
    or one row)."""
    if not shape:
        yield (), ()
        return
    first = (0, shape[0]) if slot.rows is None else slot.rows
    if slot.expert is not None:
        lead: Box = ((slot.expert, slot.expert + 1),)
        inner = tuple(shape[1:])
        if not inner:
            yield lead, ()
            return
    else:
        lead, inner = (), (first[1] - first[0], *shape[1:])
    base = 0 if slot.expert is not None else first[0]
    for rows in row_ranges(inner, itemsize):
        box = (*lead, (base + rows.start, base + rows.stop), *((0, size) for size in inner[1:]))
        yield box, (rows.stop - rows.start, *inner[1:])


def _gather_box(
    local: torch.Tensor, holders: dict[Box, int], box: Box, buffer: BlockBuffer | None
) -> torch.Tensor | None:
    """The region ``box`` of the parameter on the writer (``None`` elsewhere), from the ranks in ``holders``;
    made in ``buffer`` when one is given."""
    rank = dist.get_rank()
    shape = tuple(stop - start for start, stop in box)
    out = None
    if rank == WRITER_RANK and buffer is not None:
        out = buffer.take(shape, local.dtype, local.device)
    elif rank == WRITER_RANK:
        out = torch.empty(shape, dtype=local.dtype, device=local.device)
    for region, source in holders.items():
        part = _overlap(region, box)
        if part is None or rank not in (source, WRITER_RANK):
            continue
        theirs = local[_within(part, region)] if rank == source else None
        if rank == source == WRITER_RANK:
            assert out is not None and theirs is not None
            out[_within(part, box)].copy_(theirs)
        elif rank == source:
            assert theirs is not None
            dist.send(theirs.contiguous(), WRITER_RANK)
        else:
            assert out is not None
            place = out[_within(part, box)]
            if place.is_contiguous():
                dist.recv(place, source)  # straight into its place in the block
                continue
            piece = torch.empty(place.shape, dtype=local.dtype, device=local.device)
            dist.recv(piece, source)
            place.copy_(piece)
    return out


def gather_blocks(param: DTensor, slot: HFSlot, buffer: BlockBuffer | None = None) -> Iterator[torch.Tensor]:
    """The tensor ``slot`` names in ``param`` on the writer (``WRITER_RANK``), as row
    blocks of at most ``BLOCK_BYTES`` on its local device, in order; nothing on every other rank.

    With ``buffer`` every block is gathered into its bytes, so a block is valid only until the next one is asked
    for (write or copy it first, as ``StreamedFile.append`` does); without, each block is a tensor of its own.

    A collective: every rank of the default group iterates it to the end, for the same parameters and
    slots in the same order. Parameters whose mesh does not span the whole group, or whose placements
    are not plain ``Shard`` and ``Replicate``, are gathered whole with ``full_tensor`` instead.
    """
    with torch.no_grad():
        plain = all(type(placement) in (Shard, Replicate) for placement in param.placements)
        if not plain or param.device_mesh.size() != dist.get_world_size():
            whole = param.full_tensor()
            if dist.get_rank() == WRITER_RANK:
                yield slot.view(whole)
            return
        local = param._local_tensor
        holders: dict[Box, int] = {}
        for source, region in enumerate(_regions(param)):
            if all(start < stop for start, stop in region):
                holders.setdefault(region, source)  # the lowest rank holding each region sends it
        for box, shape in slot_blocks(tuple(param.shape), slot, local.element_size()):
            block = _gather_box(local, holders, box, buffer)
            if block is not None:
                yield block.view(shape)
            del block
