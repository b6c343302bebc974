"""The torch_xla lane's SPMD mode: one process drives a mesh of every device, sharded by the family's plan."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from titanpod.device import Backend
from titanpod.parallel.torch_xla_executor import shard_batch, shard_parameters, spmd_mesh
from titanpod.recipes.families import sharding_plan
from titanpod.recipes.recipe import Recipe


@dataclass(frozen=True)
class SpmdMesh:
    """The mesh a torch_xla SPMD run shards over."""

    axes: dict[str, int]
    """Axis name -> size, outermost first (``recipe.parallel`` over every device)."""
    mesh: Any
    """The ``torch_xla.distributed.spmd.Mesh``."""

    @property
    def data_degree(self) -> int:
        """Data-parallel ranks of the mesh: the one process loads the batch of each of them."""
        from titanpod.parallel import DATA_AXES

        return math.prod(self.axes[axis] for axis in DATA_AXES)

    def shard(self, model: nn.Module, recipe: Recipe) -> None:
        """Lay ``model``'s parameters (on the ``xla`` device) out by its family's plan."""
        shard_parameters(model, sharding_plan(recipe.model.family), self.mesh, self.axes)


def start_spmd(recipe: Recipe, backend: Backend, world_size: int) -> SpmdMesh | None:
    """On the torch_xla lane in one process whose devices (``CPU_NUM_DEVICES`` on the host, the chips on a TPU)
    are more than one: switch torch_xla to SPMD over ``recipe.parallel``'s mesh and return it; else ``None``.

    Runs before any ``xla`` tensor is made. Batches are then split over the mesh's data axes as they
    reach the device (``backend.place_batch``).
    """
    if backend.lane != "torch_xla" or world_size > 1:
        return None
    axes = recipe.parallel.mesh_axes(backend.device_count())
    if math.prod(axes.values()) == 1:
        return None
    mesh = spmd_mesh(axes)
    backend.use_spmd(lambda tensor: shard_batch(tensor, mesh, axes))  # type: ignore[attr-defined]
    return SpmdMesh(axes, mesh)
