"""Where a run's model lives: the one placement every runner (pretraining, SFT, GRPO, diffusion) uses.

Two calls, in this order:

1. ``start_placement`` before any model is built: checks the layout against the runners' table
   (``titanpod.recipes.layout_support``, which the dry run reads too), the process count and the sequence
   length, and on the torch_xla lane over several devices switches torch_xla to SPMD (before any ``xla``
   tensor exists).
2. ``LayoutStart.place(model, family, initial_values)``: one of five placements, by the lane's kind and the
   launch: one controller for every device (the compiler partitions the step by the plan), torch_xla SPMD,
   pipeline stages under torchrun, the model sharded under torchrun, or one process. What comes back says
   what the step trains, which share of the data this process reads, how its loss is averaged and what
   the step builder needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from titanpod.device import Backend, process_info
from titanpod.models import RegionValues
from titanpod.parallel import DATA_AXES, ParallelConfig, ShardingPlan, check_sequence_length
from titanpod.parallel.torch_executor import ParallelModel, PipelineModel, parallelize, parallelize_pipeline
from titanpod.recipes.families import sharding_plan
from titanpod.recipes.layout_support import RUNNER_SUPPORT, Runner, check_layout
from titanpod.runs.process_count import check_process_count
from titanpod.runs.torch_xla_spmd import SpmdMesh, start_spmd

ENTRY_MODULES: dict[Runner, str] = {
    "pretrain": "titanpod.pretrain.cli",
    "sft": "titanpod.posttrain.cli",
    "grpo": "titanpod.posttrain.cli",
    "diffusion": "titanpod.diffusion.cli",
}
"""The module torchrun starts for each runner's job (named in the launch hint of a refused process count)."""


@dataclass
class Placement:
    """A model placed for training, and what follows from where it is."""

    model: nn.Module
    """What the step trains and the checkpoints hold: the model, or this rank's pipeline stages."""
    kind: str
    """The placement in words: ``one process``, ``sharded``, ``pipeline``, ``one controller`` or ``torch_xla spmd``."""
    data_rank: int
    """This process's data-parallel rank."""
    data_world: int
    """Data-parallel ranks that read their own share of each batch (1 where one process reads them all)."""
    batches_per_process: int = 1
    """Data ranks whose batches this process loads: every data rank of the mesh for one controller."""
    sharded: ParallelModel | None = None
    """The model sharded over the job's processes, when it is."""
    pipeline: PipelineModel | None = None
    """This rank's pipeline stages, when there are any."""
    xla_axes: dict[str, int] | None = None
    """The mesh one controller partitions the step over (axis -> size)."""
    initial_values: RegionValues | None = None
    """What a meta model's parameters are created from, where the step creates them (one controller)."""
    plan: ShardingPlan | None = None
    """The family's sharding plan."""
    whole: nn.Module | None = None
    """The model as built (a pipeline rank's ``model`` is a part of it): names, shapes and dtypes of the whole."""

    @property
    def reduce_loss(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """Mean of a value over the data ranks (``None`` where there is one data rank a process)."""
        return None if self.sharded is None else self.sharded.mean_over_data

    def batch_size(self, per_data_rank: int) -> int:
        """The batch this process loads, from the recipe's batch per data rank."""
        return per_data_rank * self.batches_per_process

    def describe(self, parallel: ParallelConfig, world_size: int) -> str:
        """The layout in words for a run's header: the placement, and the mesh axes larger than 1
        (``sharded (fsdp 4, tp 2)``, ``one process``)."""
        axes = self.xla_axes or (parallel.mesh_axes(world_size) if world_size > 1 else {})
        shown = ", ".join(f"{axis} {size}" for axis, size in axes.items() if size > 1)
        return f"{self.kind} ({shown})" if shown else self.kind

    def step_options(self, parallel: ParallelConfig) -> dict[str, Any]:
        """The keyword arguments ``titanpod.graph.build_step`` takes from the placement."""
        return {
            "plan": self.plan,
            "axes": self.xla_axes,
            "initial_values": self.initial_values,
            "pipeline": self.pipeline,
            "gather_dtype": getattr(torch, parallel.param_dtype),  # FSDP gathers in the plan's dtype
        }


@dataclass
class LayoutStart:
    """A layout checked before any model is built; ``place`` lays out the model."""

    runner: Runner
    """The runner placing its model."""
    parallel: ParallelConfig
    """The recipe's parallel degrees."""
    grad_accum_steps: int
    """Micro-batches a step (a pipeline's schedule runs them)."""
    backend: Backend
    """The run's lane."""
    world_size: int
    """Processes in the job."""
    spmd: SpmdMesh | None = None
    """torch_xla's SPMD mesh, when one process drives several torch_xla devices."""

    def place(self, model: nn.Module, family: str, initial_values: RegionValues | None = None) -> Placement:
        """Lay ``model`` out for training by ``family``'s plan (see the module docstring).

        ``initial_values``: for a model still on the meta device, what each rank (each device) creates its own
        shards from (a seed's region init, or a reader of a pretrained folder)."""
        plan = sharding_plan(family)
        backend, parallel = self.backend, self.parallel
        if backend.single_controller:
            axes = parallel.mesh_axes(backend.device_count())
            data_degree = math.prod(axes[axis] for axis in DATA_AXES)
            return Placement(
                model, "one controller", 0, 1, data_degree, xla_axes=axes, initial_values=initial_values, plan=plan
            )
        if self.spmd is not None:
            self.spmd.shard(model, plan)
            return Placement(model, "torch_xla spmd", 0, 1, self.spmd.data_degree, plan=plan)
        if self.world_size > 1 and parallel.pp > 1:
            pipeline = parallelize_pipeline(model, plan, parallel, backend, self.grad_accum_steps, initial_values)
            sharded = pipeline.sharded
            return Placement(
                pipeline.model,
                "pipeline",
                sharded.data_rank,
                sharded.data_world,
                sharded=sharded,
                pipeline=pipeline,
                plan=plan,
                whole=model,
            )
        if self.world_size > 1:
            sharded = parallelize(model, plan, parallel, backend, initial_values)
            return Placement(model, "sharded", sharded.data_rank, sharded.data_world, sharded=sharded, plan=plan)
        return Placement(model, "one process", 0, 1, plan=plan)


def start_placement(
    runner: Runner,
    parallel: ParallelConfig,
    train: Any,
    backend: Backend,
    seq_len: int | None = None,
    world_size: int | None = None,
) -> LayoutStart:
    """Check the layout before any work and start what must come before the model (torch_xla's SPMD).

    ``PlanError`` naming the field and the fix when ``runner`` does not train this layout on the backend's lane,
    when the degrees need more processes than the job has (naming the torchrun command), or when ``seq_len``
    does not split over ``parallel.cp``. ``train``: the recipe's ``TrainConfig``; ``world_size``: the job's
    processes (``process_info()``'s by default).
    """
    check_layout(runner, backend.lane, backend, parallel, train)
    world_size = process_info().world_size if world_size is None else world_size
    spmd = None
    if RUNNER_SUPPORT[runner].one_process_mesh:  # torch_xla over several devices: before any xla tensor
        spmd = start_spmd(parallel, backend, world_size)
    if spmd is None:
        check_process_count(parallel, backend, world_size, ENTRY_MODULES[runner])
    if seq_len is not None:
        check_sequence_length(seq_len, parallel.cp)
    return LayoutStart(runner, parallel, train.grad_accum_steps, backend, world_size, spmd)
