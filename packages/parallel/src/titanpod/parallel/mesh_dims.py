"""Which mesh axes split each dimension of a tensor, by the plan: shared by both SPMD executors.

An entry per tensor dimension: ``None`` (whole), an axis name, or a tuple of axis names (the
dimension split over their product, outermost first). Axes of size 1 are left out.
"""

from __future__ import annotations

from collections.abc import Mapping

from titanpod.parallel.config import DATA_AXES, PARAM_SHARD_AXES
from titanpod.parallel.plan import ShardingPlan

MeshDims = tuple[str | tuple[str, ...] | None, ...]
"""Per tensor dimension: ``None``, one axis name, or several (split over their product)."""


def present_axes(axes: Mapping[str, int], names: tuple[str, ...]) -> tuple[str, ...]:
    """The axes of ``names`` that ``axes`` gives more than one device."""
    return tuple(name for name in names if axes.get(name, 1) > 1)


def _entry(names: list[str]) -> str | tuple[str, ...] | None:
    return tuple(names) if len(names) > 1 else (names[0] if names else None)


def param_mesh_dims(plan: ShardingPlan, name: str, ndim: int, axes: Mapping[str, int]) -> MeshDims:
    """The dims of parameter ``name``: its shard dimension over the data shard axes (``fsdp`` and ``cp``, plus
    ``ep`` for non-experts), its tp dimension over ``tp``, its expert dimension over ``ep``."""
    rule = plan.rule_for(name)
    expert = rule.ep_dim is not None
    dims: list[list[str]] = [[] for _ in range(ndim)]
    if rule.shard_dim is not None:
        dims[rule.shard_dim].extend(present_axes(axes, PARAM_SHARD_AXES if expert else (*PARAM_SHARD_AXES, "ep")))
    if rule.tp_dim is not None:
        dims[rule.tp_dim].extend(present_axes(axes, ("tp",)))
    if expert:
        dims[rule.ep_dim].extend(present_axes(axes, ("ep",)))  # type: ignore[index]
    return tuple(_entry(d) for d in dims)


def gathered_param_mesh_dims(plan: ShardingPlan, name: str, ndim: int, axes: Mapping[str, int]) -> MeshDims:
    """The dims of parameter ``name`` where a block uses it (FSDP's gather): its storage's, less the data shard
    axes; the tp dimension stays split over ``tp`` and an expert dimension over ``ep``."""
    stored = param_mesh_dims(plan, name, ndim, axes)
    kept = ("tp", "ep") if plan.rule_for(name).ep_dim is not None else ("tp",)

    def keep(entry: str | tuple[str, ...] | None) -> str | tuple[str, ...] | None:
        names = [entry] if isinstance(entry, str) else list(entry or ())
        return _entry([axis for axis in names if axis in kept])

    return tuple(keep(entry) for entry in stored)


def batch_mesh_dims(axes: Mapping[str, int], ndim: int = 2) -> MeshDims:
    """The dims of a batch [B, S, ...]: B split over every data axis, S over ``cp`` (context parallelism:
    each device holds a stretch of every row; the partitioner brings keys and values to the queries that
    attend to them), the rest whole."""
    sequence = _entry(list(present_axes(axes, ("cp",)))) if ndim > 1 else None
    return (_entry(list(present_axes(axes, DATA_AXES))), sequence, *([None] * (ndim - 2)))[:ndim]
