"""The parallelism part of a run's config: how many ways each mesh axis splits the job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from titanpod.parallel.errors import PlanError

Dtype = Literal["float32", "bfloat16", "float16"]
"""What ``ParallelConfig.param_dtype`` and ``reduce_dtype`` accept."""

MESH_AXES = ("dp_replicate", "fsdp", "ep", "tp")
"""Mesh axes, outermost first. ``cp`` (context parallelism) is named in plans but not yet applied."""

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
    sequence_parallel: bool = True
    """With tp > 1, also split the sequence of the activations between tp regions (norms, residuals)."""
    param_dtype: Dtype = "float32"
    """Dtype parameters are gathered in for compute (mixed precision keeps fp32 masters)."""
    reduce_dtype: Dtype = "float32"
    """Dtype gradients are reduced in."""

    def mesh_axes(self, world_size: int) -> dict[str, int]:
        """Axis name -> size for a job of ``world_size`` processes, outermost first."""
        fixed = {"dp_replicate": self.dp_replicate, "ep": self.ep, "tp": self.tp}
        bad = [f"{name}={size}" for name, size in fixed.items() if size < 1]
        if bad or self.fsdp == 0 or self.fsdp < -1:
            raise PlanError(
                f"Parallel degrees must be at least 1 (fsdp may be -1); got {bad or [f'fsdp={self.fsdp}']}."
            )
        others = self.dp_replicate * self.ep * self.tp
        fsdp = self.fsdp if self.fsdp != -1 else world_size // others
        if fsdp < 1 or others * fsdp != world_size:
            raise PlanError(
                f"dp_replicate={self.dp_replicate} x fsdp={self.fsdp} x ep={self.ep} x tp={self.tp} does not divide "
                f"into {world_size} processes; choose degrees whose product is {world_size}."
            )
        return {"dp_replicate": self.dp_replicate, "fsdp": fsdp, "ep": self.ep, "tp": self.tp}
