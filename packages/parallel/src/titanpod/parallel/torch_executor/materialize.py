"""Sharded creation: a parameter left on the meta device becomes a DTensor whose local shard alone
is allocated, on this rank's device, and filled from a function giving any region's values.

Nothing whole is ever made: each rank asks for exactly the region of each parameter its
placements give it (Shard of FSDP, TP, EP and their combinations; a Replicate axis asks for
the whole extent along it), so a model too large for one host can start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from titanpod.parallel.errors import PlanError

RegionValues = Callable[[str, tuple[slice, ...]], torch.Tensor]
"""``values(name, region)``: the values of parameter ``name`` over ``region`` (one slice per dimension,
start and stop set), a tensor of the region's shape; e.g. ``titanpod.models.region_initializer(model, seed)``."""


def local_region(shape: Sequence[int], mesh: DeviceMesh, placements: Sequence[Placement]) -> tuple[slice, ...]:
    """The region of a tensor of full ``shape`` that this rank holds under ``placements`` on ``mesh``."""
    local_shape, offset = compute_local_shape_and_global_offset(tuple(shape), mesh, placements)
    return tuple(slice(start, start + size) for start, size in zip(offset, local_shape, strict=True))


def sharded_parameter(
    name: str,
    meta: torch.Tensor,
    mesh: DeviceMesh,
    placements: Sequence[Placement],
    values: RegionValues,
    device: torch.device,
) -> nn.Parameter:
    """Parameter ``name`` (``meta``: its shape and dtype, on the meta device) as a DTensor on ``mesh`` with
    ``placements``, its local shard made on ``device`` from ``values`` of this rank's region alone."""
    region = local_region(meta.shape, mesh, placements)
    local = values(name, region)
    expected = tuple(piece.stop - piece.start for piece in region)
    if tuple(local.shape) != expected:
        raise PlanError(
            f"The initial values of {name} over {region} have shape {tuple(local.shape)}, not {expected}: "
            "the function giving them must return exactly the region asked for."
        )
    local = local.to(device=device, dtype=meta.dtype).contiguous()
    stored = DTensor.from_local(local, mesh, placements, run_check=False, shape=meta.shape, stride=meta.stride())
    return nn.Parameter(stored, requires_grad=meta.requires_grad)


def check_materializable(model: nn.Module, values: RegionValues | None) -> None:
    """``PlanError`` when ``model`` has meta parameters but no ``values`` to create them from, or meta buffers
    (which have no values to draw); named, with the fix."""
    on_meta = [name for name, param in model.named_parameters() if param.is_meta]
    if on_meta and values is None:
        raise PlanError(
            f"{len(on_meta)} parameters of the model are on the meta device (e.g. {on_meta[0]}) and no initial values "
            "were given: pass initial_values (e.g. titanpod.models.region_initializer(model, seed)) so each rank "
            "creates its own shards, or materialise the model first (to_empty, then init_weights)."
        )
    meta_buffers = [name for name, buffer in model.named_buffers() if buffer.is_meta]
    if meta_buffers:
        raise PlanError(
            f"Buffers {', '.join(meta_buffers[:3])} are on the meta device; sharded creation makes parameters only. "
            "Materialise buffers before parallelize."
        )
