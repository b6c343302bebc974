"""Per-device memory of a pipeline-parallel run (``parallel.pp`` > 1): each pp rank's stages and in-flight activations.

A pp rank holds its stages' parameters (the first also the embedding, the last the norm and head), sharded
over its sub-mesh. Its activations are those of the stage forwards it has run and not yet run backward
for, at the schedule's peak: under 1F1B rank r holds ``min(pp - r, micro-batches)`` micro-batches of its
layers; under interleaved 1F1B, the warm-up forwards of torch's schedule plus one (``in_flight_forwards``),
each of one stage's layers. The head's activations count on the last rank, for one micro-batch. The
device's figure is the largest over the pp ranks (the first and the last are the extremes).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from titanpod.parallel import ShardingPlan
from titanpod.parallel.torch_executor import PipelineLayout
from titanpod.parallel.torch_executor.pipeline_stages import RankStages, cut_stages

MemoryOf = Callable[[int, int, bool], object]
"""``memory_of(local_parameters, kept_layers, holds_head)``: the planner's ``MemoryPlan`` of one rank."""


def in_flight_forwards(layout: PipelineLayout, pp_rank: int) -> int:
    """Stage forwards whose activations pp rank ``pp_rank`` keeps at once, at its peak, under ``layout``."""
    if layout.schedule == "1f1b":
        return min(layout.pp - pp_rank, layout.microbatches)
    rounds = max(1, layout.microbatches // layout.pp)
    per_round = layout.microbatches // rounds
    warmup = (layout.stages_per_rank - 1) * per_round + 2 * (layout.pp - 1 - pp_rank)
    return min(warmup + 1, layout.microbatches * layout.stages_per_rank)


def rank_local_numel(
    model: nn.Module, plan: ShardingPlan, mesh: dict[str, int], layout: PipelineLayout, rank: int
) -> int:
    """Elements of parameters pp rank ``rank`` holds on one device of its sub-mesh (``model`` on the meta device)."""
    stages = RankStages(cut_stages(model, layout, rank))
    return sum(plan.local_numel(name, tuple(p.shape), mesh) for name, p in stages.named_parameters())


def pipeline_memory(
    model: nn.Module, plan: ShardingPlan, mesh: dict[str, int], layout: PipelineLayout, memory_of: MemoryOf
) -> object:
    """The ``MemoryPlan`` of the pp rank with the largest total (``memory_of`` builds one rank's)."""
    layers_per_stage = len(model.layers) // layout.n_stages
    plans = []
    for rank in sorted({0, layout.pp - 1}):
        local = rank_local_numel(model, plan, mesh, layout, rank)
        kept_layers = in_flight_forwards(layout, rank) * layers_per_stage
        plans.append(memory_of(local, kept_layers, rank == layout.pp - 1))
    return max(plans, key=lambda memory: memory.total)  # type: ignore[attr-defined]
