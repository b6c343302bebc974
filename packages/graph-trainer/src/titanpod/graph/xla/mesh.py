"""The xla step's mesh and the shardings of what is not a parameter: batches and replicated values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from titanpod.device import Backend


def default_mesh(backend: Backend, axes: Mapping[str, int]) -> Any:
    """The mesh over ``axes`` (axes of size 1 dropped); one device when no axis splits anything."""
    import jax

    split = {name: size for name, size in axes.items() if size > 1}
    if split:
        return backend.build_mesh(split)
    return jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("replica",))


def replicated(mesh: Any) -> Any:
    """The sharding of a value every device of ``mesh`` holds whole (the step count, the learning rate, the loss)."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Any, axes: Mapping[str, int]) -> Any:
    """The sharding of a step's tokens [A, B, S]: B split over the mesh's data axes."""
    from jax.sharding import NamedSharding, PartitionSpec

    from titanpod.parallel.xla_executor import batch_partition_spec

    return NamedSharding(mesh, PartitionSpec(None, *batch_partition_spec(axes, 2)))
