"""The XLA executor: a sharding plan as ``NamedSharding``s, for XLA's SPMD partitioner.

Parameters are placed on a ``jax.sharding.Mesh`` (from ``titanpod.device``'s xla lane)
by the same rules the torch executor uses (``place_params``), or made there already sharded,
each device's shard from a function giving any region's values (``create_params``); a
``jax.jit``-ed step over them then gets its all-gathers and gradient reductions from the
partitioner. Imports jax only when called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from titanpod.parallel.mesh_dims import batch_mesh_dims, gathered_param_mesh_dims, param_mesh_dims
from titanpod.parallel.plan import ShardingPlan


def param_partition_spec(plan: ShardingPlan, name: str, ndim: int, axes: Mapping[str, int]) -> Any:
    """The ``PartitionSpec`` of parameter ``name`` (see ``titanpod.parallel.mesh_dims.param_mesh_dims``)."""
    from jax.sharding import PartitionSpec

    return PartitionSpec(*param_mesh_dims(plan, name, ndim, axes))


def gathered_partition_spec(plan: ShardingPlan, name: str, ndim: int, axes: Mapping[str, int]) -> Any:
    """The ``PartitionSpec`` of parameter ``name`` where a block uses it: gathered over the data shard axes
    (see ``titanpod.parallel.mesh_dims.gathered_param_mesh_dims``)."""
    from jax.sharding import PartitionSpec

    return PartitionSpec(*gathered_param_mesh_dims(plan, name, ndim, axes))


def batch_partition_spec(axes: Mapping[str, int], ndim: int = 2) -> Any:
    """The ``PartitionSpec`` of a batch: its first dimension split over every data axis, the second over ``cp``."""
    from jax.sharding import PartitionSpec

    return PartitionSpec(*batch_mesh_dims(axes, ndim))


def place_params(params: Mapping[str, Any], plan: ShardingPlan, mesh: Any, axes: Mapping[str, int]) -> dict[str, Any]:
    """Put each parameter (a CPU torch tensor or array) on ``mesh`` with the plan's sharding; returns jax arrays."""
    import jax
    from jax.sharding import NamedSharding

    placed = {}
    for name, value in params.items():
        array = _as_array(value)
        spec = param_partition_spec(plan, name, array.ndim, axes)
        placed[name] = jax.device_put(array, NamedSharding(mesh, spec))
    return placed


def create_params(
    shapes: Mapping[str, tuple[int, ...]],
    values: Callable[[str, tuple[slice, ...]], Any],
    mesh: Any,
    plan: ShardingPlan | None = None,
    axes: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Make each parameter of ``shapes`` (name -> full shape) on ``mesh`` already sharded: with the plan's
    sharding, or replicated without a plan. Each device's shard is filled from ``values(name, region)``
    (a CPU torch tensor or array of that region, e.g. ``titanpod.models.region_initializer(model, seed)``),
    so no parameter is ever whole on the host; returns jax arrays in the dtype ``values`` gives."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    created = {}
    for name, shape in shapes.items():
        shape = tuple(int(size) for size in shape)
        spec = PartitionSpec() if plan is None else param_partition_spec(plan, name, len(shape), axes or {})

        def shard(index: tuple[slice, ...] | None, name: str = name, shape: tuple[int, ...] = shape) -> Any:
            pieces = index if index is not None else tuple(slice(None) for _ in shape)
            region = tuple(slice(*piece.indices(size)[:2]) for piece, size in zip(pieces, shape, strict=True))
            return _as_array(values(name, region))

        created[name] = jax.make_array_from_callback(shape, NamedSharding(mesh, spec), shard)
    return created


def _as_array(value: Any) -> Any:
    import numpy as np

    return np.asarray(value.detach().cpu()) if hasattr(value, "detach") else np.asarray(value)
