"""The parallelism part of a run's config: how many ways each mesh axis splits the job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from titanpod.parallel.errors import PlanError

Dtype = Literal["float32", "bfloat16", "float16"]
"""What ``ParallelConfig.param_dtype`` and ``reduce_dtype`` accept."""
PipelineSchedule = Literal["1f1b", "interleaved_1f1b"]
"""What ``ParallelConfig.pp_schedule`` accepts."""

MESH_AXES = ("pp", "dp_replicate", "fsdp", "cp", "ep", "tp")
"""Mesh axes, outermost first: pipeline stages, replicas, parameter shards, sequence (context) chunks,
experts, tensor-parallel ranks."""

PARAM_SHARD_AXES = ("fsdp", "cp")
"""Axes a parameter's shard dimension splits over (``ep`` too, for parameters that are not experts):
context-parallel ranks hold the same parameters as each other, so they share their storage as FSDP ranks do."""

DATA_AXES = ("dp_replicate", "fsdp", "ep")
"""Axes whose ranks read different data (expert-parallel ranks do too)."""


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of parallelism; their product is the number of processes."""

    dp_replicate: int = 1
    """Replicas that all-reduce gradients (the outer axis of HSDP)."""
    fsdp: int = -1
    """Ranks that shard parameters, gradients and optimizer state; -1 takes what the other axes leave."""
    ep: int = 1
    """Ranks that split the experts of MoE layers between them (they also shard the other parameters)."""
    tp: int = 1
    """Ranks that split attention heads and feed-forward width (tensor parallelism)."""
    cp: int = 1
    """Ranks that split each sequence between them (context parallelism): each holds two opposite chunks
    of every row (chunk r and chunk 2cp-1-r, so causal attention costs every rank the same) and attends
    over the keys and values gathered from the others. They read the same batch."""
    pp: int = 1
    """Pipeline stages: ranks that each hold a contiguous run of the model's layers and pass activations on."""
    pp_schedule: PipelineSchedule = "1f1b"
    """With pp > 1, the order stages run micro-batches in: ``1f1b`` (one stage per rank; after a warm-up each
    rank alternates one forward and one backward) or ``interleaved_1f1b`` (``pp_stages_per_rank`` stages per
    rank, dealt round-robin: rank r holds stages r, r + pp, ...; a smaller bubble for more messages)."""
    pp_stages_per_rank: int = 0
    """With pp > 1, the pipeline stages each rank holds: 0 picks 1 for ``1f1b`` and 2 for ``interleaved_1f1b``;
    ``1f1b`` takes only 1, ``interleaved_1f1b`` 2 or more. The model's layers must divide into pp x this stages."""
    pp_microbatches: int = 0
    """With pp > 1, the micro-batches the pipeline splits a step's batch into (``data.batch_size`` x
    ``train.grad_accum_steps`` sequences a data rank, which they must divide); 0 takes ``train.grad_accum_steps``
    when above 1, else pp. Both schedules need at least pp of them, and ``interleaved_1f1b`` a multiple of pp.
    The runner and the dry run plan the step as ``titanpod.recipes.pipeline_batch`` rewrites it: that many
    accumulated micro-batches of the step's sequences / micro-batches each."""
    pp_recompute: bool = False
    """With pp > 1, recompute each layer's activations in its backward (``torch.utils.checkpoint``) instead of
    keeping them: the micro-batches in flight then keep only each layer's input. A pipeline step runs eager,
    where ``train.memory_policy`` does not apply; this is its recompute."""
    sequence_parallel: bool = True
    """With tp > 1, also split the sequence of the activations between tp regions (norms, residuals)."""
    param_dtype: Dtype = "float32"
    """Dtype parameters are gathered in for compute (mixed precision keeps fp32 masters)."""
    reduce_dtype: Dtype = "float32"
    """Dtype gradients are reduced in."""
    fsdp_bucket_mb: float = 25
    """Size cap (MB of whole parameters, in ``param_dtype``) of the buckets FSDP parameters are gathered
    and their gradients reduce-scattered in: the parameters of one block (``layers.N``, or one other
    top-level module) go in as few buckets as the cap allows, each one all-gather of their concatenated
    shards going forward and one reduce-scatter going back. 0 gathers each parameter alone. Parameters
    split over tp, experts over ep and parameters kept whole always go alone. 25 MB holds a whole block
    of the small models measured: on gloo with 4 ranks, steps took 1.5-1.9x less time than with one
    gather per parameter for the Llama 3 debug model and 1.1-1.2x for a 30M one (``tools/bench/collectives.py``)."""
    fsdp_prefetch: bool = False
    """With ``fsdp_bucket_mb`` > 0: when block i's buckets are gathered, start block i+1's gathers too,
    so they travel while block i computes (within one ``nn.ModuleList``, in its order)."""

    def __post_init__(self) -> None:
        if self.fsdp_bucket_mb < 0:
            raise PlanError(
                f"fsdp_bucket_mb={self.fsdp_bucket_mb}: a bucket size is at least 0 (0 gathers each parameter alone)."
            )
        if self.fsdp_prefetch and self.fsdp_bucket_mb == 0:
            raise PlanError("fsdp_prefetch needs buckets: set fsdp_bucket_mb > 0 as well, or turn fsdp_prefetch off.")

    def mesh_axes(self, world_size: int) -> dict[str, int]:
        """Axis name -> size for a job of ``world_size`` processes, outermost first."""
        fixed = {"pp": self.pp, "dp_replicate": self.dp_replicate, "cp": self.cp, "ep": self.ep, "tp": self.tp}
        bad = [f"{name}={size}" for name, size in fixed.items() if size < 1]
        if bad or self.fsdp == 0 or self.fsdp < -1:
            raise PlanError(
                f"Parallel degrees must be at least 1 (fsdp may be -1); got {bad or [f'fsdp={self.fsdp}']}."
            )
        others = self.pp * self.dp_replicate * self.cp * self.ep * self.tp
        fsdp = self.fsdp if self.fsdp != -1 else world_size // others
        if fsdp < 1 or others * fsdp != world_size:
            degrees = " x ".join(f"{name}={size}" for name, size in {**fixed, "fsdp": self.fsdp}.items() if size != 1)
            raise PlanError(
                f"{degrees or 'fsdp=1'} does not divide into {world_size} processes; "
                f"choose degrees whose product is {world_size}."
            )
        sizes = {**fixed, "fsdp": fsdp}
        return {axis: sizes[axis] for axis in MESH_AXES}


def check_sequence_length(S: int, cp: int) -> None:
    """``ValueError`` unless a row of ``S`` tokens cuts into 2 x ``cp`` equal chunks (context parallelism)."""
    if cp > 1 and S % (2 * cp):
        raise ValueError(
            f"Context parallelism over {cp} ranks cuts each row into {2 * cp} equal chunks, but the sequence "
            f"has {S} tokens; choose data.seq_len divisible by {2 * cp} or another parallel.cp."
        )
