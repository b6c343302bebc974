"""Applying a sharding plan to a model with the torch executor."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import Placement

from titanpod.device import Backend, ensure_process_group
from titanpod.parallel.config import DATA_AXES, MESH_AXES, ParallelConfig
from titanpod.parallel.errors import PlanError
from titanpod.parallel.plan import ShardingPlan
from titanpod.parallel.torch_executor.bucketed_fsdp import BucketSummary, install_buckets, remove_buckets
from titanpod.parallel.torch_executor.collectives import mean_over
from titanpod.parallel.torch_executor.context_parallel import make_context_parallel
from titanpod.parallel.torch_executor.expert_parallel import make_expert_parallel
from titanpod.parallel.torch_executor.materialize import RegionValues, check_materializable, sharded_parameter
from titanpod.parallel.torch_executor.simple_fsdp import layout_for, shard_module_params, unshard_module_params
from titanpod.parallel.torch_executor.tensor_parallel import apply_tensor_parallel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ParallelModel:
    """A model with its parameters sharded over a mesh, and where this rank stands in it."""

    model: nn.Module
    """The same module object, its parameters now DTensors."""
    mesh: Any
    """The ``DeviceMesh`` with axes ``dp_replicate``, ``fsdp``, ``ep``, ``tp``."""
    axes: dict[str, int]
    """Axis sizes."""
    data_rank: int
    """Index of this rank's data shard (tp ranks share one)."""
    data_world: int
    """Number of data shards: dp_replicate x fsdp x ep."""
    data_axes: tuple[str, ...]
    """The mesh dimensions whose ranks read different data."""
    data_group: Any = None
    """The ``data_axes`` of ``mesh`` as one dimension (None when there are none). Made when the model is
    sharded, not at first use: a mesh made while a step is traced would meet the tracer's fake tensors."""
    mean_group: Any = None
    """The data axes and ``cp`` as one dimension (None when there are none): the ranks whose losses and
    batch statistics together make the global batch's (cp ranks each hold part of every row)."""
    buckets: BucketSummary | None = None
    """How the FSDP gathers were bucketed (``ParallelConfig.fsdp_bucket_mb``); None when each parameter goes alone."""

    def mean_over_data(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` over the ranks that hold different tokens: data-parallel and
        context-parallel (the loss for reporting, routing loads)."""
        if self.mean_group is None:
            return value
        return mean_over(value, self.mean_group)


def _create(
    prefix: str,
    mesh: Any,
    values: RegionValues,
    device: torch.device,
    name: str,
    meta: torch.Tensor,
    placements: tuple[Placement, ...],
) -> nn.Parameter:
    return sharded_parameter(prefix + name, meta, mesh, placements, values, device)


def unshard(model: nn.Module) -> nn.Module:
    """Gather every sharded parameter whole and remove the parallel wrappers' classes, in place.

    The parameters come back on every rank (a collective), e.g. to write a single-file
    checkpoint. Tensor-parallel hooks stay; use the model for saving, not for more sharded steps.
    """
    remove_buckets(model)
    for module in model.modules():
        unshard_module_params(module)
    return model


def _token_axes(data_axes: tuple[str, ...], mesh_axes: tuple[str, ...]) -> tuple[str, ...]:
    """The mesh dimensions whose ranks hold different tokens: the data axes and cp, in mesh order."""
    return tuple(axis for axis in mesh_axes if axis in data_axes or axis == "cp")


def _flat_group(mesh: Any, names: tuple[str, ...]) -> Any:
    """The dimensions ``names`` of ``mesh`` as one (None when there are none)."""
    if not names:
        return None
    return mesh[names]._flatten() if len(names) > 1 else mesh[names]


def parallelize(
    model: nn.Module,
    plan: ShardingPlan,
    config: ParallelConfig,
    backend: Backend,
    initial_values: RegionValues | None = None,
    mesh: Any = None,
) -> ParallelModel:
    """Shard ``model`` by ``plan`` over all processes.

    ``model`` is built and initialised identically on every rank, or left on the meta device:
    then each rank creates only its own shard of each parameter, on the backend's device, from
    ``initial_values(name, region)`` (e.g. ``titanpod.models.region_initializer(model, seed)``),
    and nothing whole is ever made. Checks the plan against the model and the mesh first: a
    dimension that does not divide, a parameter no rule covers, an unsupported combination or a
    meta model without ``initial_values`` is a ``PlanError`` before any tensor is moved or made.
    ``mesh``: shard over this mesh instead of building one (a pipeline stage's sub-mesh of its pp rank,
    from ``parallelize_pipeline``: its dimensions are the axes other than pp that split something).
    """
    info = ensure_process_group(backend)
    axes = config.mesh_axes(info.world_size)
    named = dict(model.named_parameters())
    plan.check(named, axes)
    check_materializable(model, initial_values)
    has_experts = any(plan.rule_for(name).ep_dim is not None for name in named)
    if axes["ep"] > 1 and not has_experts:
        raise PlanError(f"ep={axes['ep']} but the model has no experts; use ep=1.")
    if axes["pp"] > 1 and mesh is None:
        raise PlanError(
            f"pp={axes['pp']}: pipeline stages are built and sharded by "
            "titanpod.parallel.torch_executor.parallelize_pipeline, not parallelize."
        )
    if axes["tp"] > 1 and has_experts:
        raise PlanError("Tensor parallelism of mixture-of-experts layers is not supported; use ep instead of tp.")
    # Only axes that split something become mesh dimensions: a size-1 axis would add no-op collectives.
    mesh_axes = tuple(axis for axis in MESH_AXES if axis != "pp" and axes[axis] > 1) or ("fsdp",)
    if mesh is None:
        mesh = backend.build_mesh({axis: axes[axis] for axis in mesh_axes})
    elif tuple(mesh.mesh_dim_names) != mesh_axes:
        raise PlanError(f"The mesh given has dimensions {mesh.mesh_dim_names}; this config shards over {mesh_axes}.")
    param_dtype, reduce_dtype = _DTYPES[config.param_dtype], _DTYPES[config.reduce_dtype]
    device = backend.parameter_device(info.local_rank)
    # Sequence parallelism needs the plan's sequence boundaries; a plan without them (FLUX) runs plain tp.
    sequence_parallel = config.sequence_parallel and axes["tp"] > 1 and bool(plan.sequence_starts)
    if axes["tp"] > 1:
        apply_tensor_parallel(model, plan, mesh["tp"], sequence_parallel)
    for module_name, module in list(model.named_modules()):
        own = {name: p for name, p in module._parameters.items() if p is not None}
        if not own:
            continue
        prefix = f"{module_name}." if module_name else ""
        layouts = {name: layout_for(plan.rule_for(prefix + name), axes, mesh_axes, sequence_parallel) for name in own}
        expert = any(plan.rule_for(prefix + name).ep_dim is not None for name in own)
        create = None
        if initial_values is not None:
            create = functools.partial(_create, prefix, mesh, initial_values, device)
        shard_module_params(module, layouts, mesh, param_dtype, reduce_dtype, create)
        if expert and axes["ep"] > 1:
            make_expert_parallel(module, mesh["ep"])
    if axes["cp"] > 1:
        make_context_parallel(model, mesh["cp"])
    coordinate = dict(zip(mesh_axes, mesh.get_coordinate() or [0] * len(mesh_axes), strict=True))
    data_rank = 0
    for axis in DATA_AXES:
        data_rank = data_rank * axes[axis] + coordinate.get(axis, 0)
    data_axes = tuple(axis for axis in DATA_AXES if axis in mesh_axes and axes[axis] > 1)
    token_axes = _token_axes(data_axes, mesh_axes)
    data_group = _flat_group(mesh, data_axes)
    mean_group = data_group if token_axes == data_axes else _flat_group(mesh, token_axes)
    buckets = None
    if config.fsdp_bucket_mb > 0:
        dtypes = (param_dtype, reduce_dtype)
        buckets = install_buckets(
            model, plan, axes, mesh, mesh_axes, sequence_parallel, dtypes, config.fsdp_bucket_mb, config.fsdp_prefetch
        )
    data_world = math.prod(axes[a] for a in DATA_AXES)
    sharded = ParallelModel(
        model, mesh, axes, data_rank, data_world, data_axes, data_group, mean_group, buckets=buckets
    )
    ops = getattr(model, "ops", None)
    if ops is not None and hasattr(ops, "batch_mean"):  # batch statistics (MoE loads) over the global batch
        model.ops = dataclasses.replace(ops, batch_mean=sharded.mean_over_data)  # type: ignore[assignment]
    return sharded
