"""Pipeline parallelism with the torch executor: cut a decoder into stages, shard each over its pp rank's sub-mesh.

The mesh is ``pp`` outermost, then the axes that split something (dp_replicate, fsdp, cp, tp); the ranks of
one pp coordinate form a sub-mesh, and each stage that rank holds is sharded over it by ``parallelize``
exactly as a whole model would be (FSDP, TP, HSDP). Gradients are reduced over that sub-mesh only: the pp
ranks hold different parameters, so nothing is averaged over pp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from titanpod.device import Backend, ensure_process_group
from titanpod.parallel.config import MESH_AXES, ParallelConfig
from titanpod.parallel.errors import PlanError
from titanpod.parallel.plan import ShardingPlan
from titanpod.parallel.torch_executor.apply import _DTYPES, ParallelModel, parallelize
from titanpod.parallel.torch_executor.materialize import RegionValues
from titanpod.parallel.torch_executor.pipeline_stages import (
    DecoderStage,
    PipelineLayout,
    RankStages,
    check_pipelinable,
    cut_stages,
    pipeline_layout,
)


@dataclass
class PipelineModel:
    """One pipeline rank's share of a model: its stages, sharded over its sub-mesh, and where it stands."""

    model: RankStages
    """Every parameter this rank holds, under the whole model's names (for the optimizer and checkpoints)."""
    stages: list[DecoderStage]
    """This rank's stages, in pipeline order (one for 1f1b)."""
    layout: PipelineLayout
    """Stages, ranks, schedule and micro-batches."""
    pp_rank: int
    """This rank's place along the pp axis."""
    pp_group: Any
    """The process group of this rank's pp axis (the ranks that pass it activations)."""
    mesh: Any
    """The whole ``DeviceMesh``: ``pp`` then the axes the stages are sharded over."""
    sharded: ParallelModel
    """How the stages are sharded over the sub-mesh (its ``data_rank``, ``data_world`` and ``mean_over_data``
    hold for every stage of this rank; its ``model`` is the first of them)."""

    @property
    def data_rank(self) -> int:
        """Index of this rank's data shard: the pp ranks of one sub-mesh position read the same data."""
        return self.sharded.data_rank

    @property
    def data_world(self) -> int:
        """Number of data shards (pp does not split the data)."""
        return self.sharded.data_world

    def mean_over_data(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` over the data-parallel ranks of the sub-mesh."""
        return self.sharded.mean_over_data(value)


def parallelize_pipeline(
    model: nn.Module,
    plan: ShardingPlan,
    config: ParallelConfig,
    backend: Backend,
    grad_accum_steps: int,
    initial_values: RegionValues | None = None,
) -> PipelineModel:
    """Cut ``model`` (a dense decoder ``Transformer``) into ``config``'s pipeline stages and shard this rank's.

    ``grad_accum_steps`` is ``train.grad_accum_steps``: a step's micro-batches are the schedule's. ``model``
    is built alike on every rank, materialised or on the meta device with ``initial_values`` (as for
    ``parallelize``, whose checks every stage passes too). Layouts the pipeline cannot run (see
    ``pipeline_layout`` and ``check_pipelinable``) are a ``PlanError`` before any process group is made.
    Drop ``model`` afterwards: the layers other ranks hold stay in it, unsharded.
    """
    if config.pp < 2:
        raise PlanError(f"parallelize_pipeline needs parallel.pp of 2 or more, got {config.pp}; use parallelize.")
    layout = pipeline_layout(config, grad_accum_steps)
    check_pipelinable(model, layout)
    info = ensure_process_group(backend)
    axes = config.mesh_axes(info.world_size)
    inner = tuple(axis for axis in MESH_AXES if axis != "pp" and axes[axis] > 1) or ("fsdp",)
    mesh = backend.build_mesh({"pp": axes["pp"], **{axis: axes[axis] for axis in inner}})
    pp_mesh = mesh["pp"]
    pp_rank = pp_mesh.get_local_rank()
    sub_mesh = mesh[inner]
    stages = cut_stages(model, layout, pp_rank)
    sharded = [parallelize(stage, plan, config, backend, initial_values, mesh=sub_mesh) for stage in stages]
    sequence_split = axes["tp"] if config.sequence_parallel and axes["tp"] > 1 else 1
    for stage in stages:
        stage.sequence_split = sequence_split
        stage.recompute = config.pp_recompute
        stage.activation_dtype = _DTYPES[config.param_dtype]
    return PipelineModel(RankStages(stages), stages, layout, pp_rank, pp_mesh.get_group(), mesh, sharded[0])
