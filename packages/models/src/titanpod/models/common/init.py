"""The canonical parameter initialisation: any region of a parameter can be drawn alone.

A parameter's values are cut into fixed tiles along its first two dimensions (trailing
dimensions whole); each tile is drawn from its own generator, seeded from (seed, parameter
name, tile row, tile column). A region (a shard) is made of the parts of the tiles it
overlaps, drawn one tile at a time, so:

- one process initialising a whole model and N ranks each initialising only their own shards
  get the same values, bit for bit, whatever the sharding (rows, columns, experts, or none);
- drawing a region holds at most one tile beyond the region itself.

Tiles depend only on the parameter's full shape (``tile_shape``), never on a sharding. Values
are drawn on the CPU in fp32, so a seed gives the same weights on every device type.

A model opts in by naming each parameter's law: ``model.parameter_init(name) -> ParamInit``.
``init_parameters_`` initialises such a model whole (its ``init_weights``); ``region_initializer``
gives the values of any region of its parameters, for sharded creation (the torch executor's
``parallelize(..., initial_values=...)``, the xla step's ``initial_values``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import nn

TILE_ELEMENTS = 32768
"""Elements a tile aims at (128 KiB in fp32): a shard holds at most one tile more than itself while drawn.
No more than PyTorch's grain size, so a tile's clamp and copy stay on one thread: on a busy host, handing
such small work to a thread pool costs far more than it saves."""

TILE_COLUMNS = 256
"""Most tile entries along dimension 1 (a tile spans fewer when the parameter is narrower)."""

Region = tuple[slice, ...]
"""One slice per dimension of a parameter, each with start and stop set and step 1."""

RegionValues = Callable[[str, Region], torch.Tensor]
"""``values(name, region)``: the values of parameter ``name`` over ``region``, a CPU tensor of the region's shape."""


@dataclass(frozen=True)
class ParamInit:
    """How one parameter starts."""

    kind: Literal["normal", "ones", "zeros"]
    """``normal``: drawn from a normal of mean 0 and ``std``, clamped to +-``truncate`` x ``std``;
    ``ones`` and ``zeros``: constant (nothing drawn)."""
    std: float = 0.02
    """Standard deviation of a ``normal`` parameter."""
    truncate: float = 3.0
    """Where a ``normal`` parameter is cut, in standard deviations."""


class RegionInitModel(Protocol):
    """A model that names each parameter's law (see the module docstring)."""

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """The model's parameters by name (``nn.Module``'s)."""
        ...

    def parameter_init(self, name: str) -> ParamInit:
        """The law of parameter ``name``."""
        ...


def tile_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """The tile of a parameter of full ``shape``: up to ``TILE_COLUMNS`` entries along dimension 1, as many
    rows along dimension 0 as keep the tile near ``TILE_ELEMENTS`` (at least one), trailing dimensions whole."""
    shape = tuple(int(size) for size in shape)
    if not shape:
        return ()
    if len(shape) == 1:
        return (max(1, min(shape[0], TILE_ELEMENTS)),)
    columns = max(1, min(shape[1], TILE_COLUMNS))
    row_elements = columns * math.prod(shape[2:])
    rows = max(1, min(shape[0], TILE_ELEMENTS // max(row_elements, 1)))
    return (rows, columns, *shape[2:])


def tile_seed(seed: int, name: str, row: int, column: int) -> int:
    """The generator seed of tile (``row``, ``column``) of parameter ``name``: 63 bits of a BLAKE2b hash."""
    digest = hashlib.blake2b(f"{seed}/{name}/{row}/{column}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def whole_region(shape: Sequence[int]) -> Region:
    """The region covering all of a parameter of ``shape``."""
    return tuple(slice(0, int(size)) for size in shape)


def check_region(name: str, shape: Sequence[int], region: Region) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` per dimension of ``region``; ``ValueError`` naming the parameter when it does not fit."""
    bounds = []
    if len(region) != len(shape):
        raise ValueError(f"Region {region} of {name} has {len(region)} dimensions; the parameter has {len(shape)}.")
    for piece, size in zip(region, shape, strict=True):
        start, stop, step = piece.indices(int(size))
        if step != 1:
            raise ValueError(f"Region {region} of {name} has a step; regions are contiguous.")
        bounds.append((start, max(start, stop)))
    return tuple(bounds)


def _tile_spans(start: int, stop: int, extent: int, size: int) -> list[tuple[int, int, int]]:
    """(tile index, first, end) of the tiles of ``extent`` along a dimension of ``size`` that [start, stop) meets."""
    if stop <= start:
        return []
    return [(i, i * extent, min((i + 1) * extent, size)) for i in range(start // extent, (stop - 1) // extent + 1)]


def _tiles_meeting(
    shape: tuple[int, ...], bounds: tuple[tuple[int, int], ...]
) -> Iterator[tuple[tuple[int, int], tuple[int, ...], tuple[int, ...]]]:
    """For each tile the region ``bounds`` meets: its (row, column) index, its first index per dimension and
    its extent per dimension (tiles along dimensions 0 and 1; a scalar or vector has column 0 only)."""
    tile = tile_shape(shape)
    whole = [(0, 0, 1)]  # a missing dimension: one tile of index 0
    rows = _tile_spans(*bounds[0], tile[0], shape[0]) if shape else whole
    for row, row_first, row_end in rows:
        columns = _tile_spans(*bounds[1], tile[1], shape[1]) if len(shape) > 1 else whole
        for column, column_first, column_end in columns:
            firsts = (row_first, column_first, *[0] * len(shape[2:]))[: len(shape)]
            extent = (row_end - row_first, column_end - column_first, *shape[2:])[: len(shape)]
            yield (row, column), firsts, extent


def fill_region_(
    out: torch.Tensor, init: ParamInit, name: str, seed: int, shape: Sequence[int], region: Region
) -> None:
    """Write the values of ``region`` of parameter ``name`` (full ``shape``, law ``init``, ``seed``) into
    ``out``, a CPU tensor of the region's shape (any floating dtype: values are drawn in fp32 and cast)."""
    bounds = check_region(name, shape, region)
    expected = tuple(stop - start for start, stop in bounds)
    if tuple(out.shape) != expected:
        raise ValueError(f"{name}: the output has shape {tuple(out.shape)}, the region {region} has {expected}.")
    if init.kind != "normal":
        out.fill_(1.0 if init.kind == "ones" else 0.0)
        return
    limit = init.truncate * init.std
    generator = torch.Generator()
    for (row, column), firsts, extent in _tiles_meeting(tuple(int(size) for size in shape), bounds):
        generator.manual_seed(tile_seed(seed, name, row, column))
        values = torch.empty(extent).normal_(0.0, init.std, generator=generator).clamp_(-limit, limit)
        source, target = [], []
        for (start, stop), first, size in zip(bounds, firsts, extent, strict=True):
            low, high = max(start, first), min(stop, first + size)
            source.append(slice(low - first, high - first))
            target.append(slice(low - start, high - start))
        out[tuple(target)].copy_(values[tuple(source)])


def region_values(init: ParamInit, name: str, seed: int, shape: Sequence[int], region: Region) -> torch.Tensor:
    """The values of ``region`` of parameter ``name`` as a new fp32 CPU tensor of the region's shape."""
    bounds = check_region(name, shape, region)
    out = torch.empty(tuple(stop - start for start, stop in bounds))
    fill_region_(out, init, name, seed, shape, region)
    return out


@torch.no_grad()
def init_parameters_(model: RegionInitModel, seed: int) -> None:
    """Initialise every parameter of ``model`` whole and in place from ``seed``, on whatever device it lives.

    A CPU parameter is filled tile by tile where it lies; any other is drawn on the CPU and copied over.
    """
    for name, param in model.named_parameters():
        init = model.parameter_init(name)
        region = whole_region(param.shape)
        if param.device.type == "cpu":
            fill_region_(param.data, init, name, seed, param.shape, region)
        else:
            param.copy_(region_values(init, name, seed, param.shape, region))


def region_initializer(model: RegionInitModel, seed: int) -> RegionValues:
    """The values of any region of ``model``'s parameters from ``seed``, as ``init_parameters_`` sets them.

    The parameters' shapes are read now, so ``model`` may be on the meta device and be sharded afterwards.
    """
    laws = {name: (model.parameter_init(name), tuple(param.shape)) for name, param in model.named_parameters()}

    def values(name: str, region: Region) -> torch.Tensor:
        if name not in laws:
            raise KeyError(f"The model has no parameter {name!r}; it has {len(laws)}, e.g. {next(iter(laws), None)!r}.")
        init, shape = laws[name]
        return region_values(init, name, seed, shape, region)

    return values
