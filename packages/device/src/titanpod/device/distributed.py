"""The process group: joined from torchrun's environment, or a group of one."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

from titanpod.device.backend import Backend


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands in the job."""

    rank: int
    """Global rank, 0 .. world_size - 1."""
    local_rank: int
    """Rank on this host; selects the device."""
    world_size: int
    """Number of processes in the job."""

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process that prints and writes shared files."""
        return self.rank == 0


def process_info() -> ProcessInfo:
    """This process's place in the job, from torchrun's variables (one process without them)."""
    return ProcessInfo(
        rank=int(os.environ.get("RANK", "0")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
    )


def ensure_process_group(backend: Backend) -> ProcessInfo:
    """Join the job's default process group if not yet joined, and say where we stand.

    Under torchrun the rendezvous comes from its environment; a lone process gets a group
    of one on an in-memory store, so single-process code can use meshes and DTensors too.
    """
    info = process_info()
    if dist.is_initialized():
        return ProcessInfo(dist.get_rank(), info.local_rank, dist.get_world_size())
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend=backend.dist_backend)
    else:
        if info.world_size != 1:
            raise RuntimeError(
                f"WORLD_SIZE is {info.world_size} but MASTER_ADDR is unset: start multi-process "
                "jobs with torchrun (e.g. torchrun --nproc-per-node 4 ...)."
            )
        dist.init_process_group(backend=backend.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
    return ProcessInfo(dist.get_rank(), info.local_rank, dist.get_world_size())
