"""The process group: joined from torchrun's environment, or a group of one."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist


class CollectiveLane(Protocol):
    """What joining the process group and building a mesh ask of a backend (``titanpod.device.Backend``)."""

    @property
    def dist_backend(self) -> str | None:
        """The torch.distributed backend; ``None`` lets PyTorch pick the one registered for the device."""
        ...

    @property
    def device_type(self) -> str:
        """The ``torch.device`` type of the lane's tensors."""
        ...


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands in the job."""

    rank: int
    """Global rank, 0 .. world_size - 1."""
    local_rank: int
    """Rank on this host; selects the device."""
    world_size: int
    """Number of processes in the job."""
    local_world_size: int = 1
    """Number of the job's processes on this host (they share its memory)."""

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
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    )


def attempt_store(environ: Mapping[str, str], timeout: timedelta | None = None) -> dist.Store | None:
    """The key-value store of this attempt of a job that torchrun restarts, ``None`` elsewhere.

    torchrun's agent hosts one store for the job's whole life (``TORCHELASTIC_USE_AGENT_STORE``),
    and after a restart the new workers would read the dead ones' addresses from it. Each attempt
    (``TORCHELASTIC_RESTART_COUNT``) therefore gets keys of its own, under ``titanpod/attempt-N/``; each rank
    records its host and pid there as ``member-<rank>``, so a survivor can tell which rank was lost.
    ``timeout`` bounds each wait on the store (torch's default when ``None``).
    """
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    attempt = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    address, port, world_size = environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), int(environ.get("WORLD_SIZE", "1"))
    if timeout is None:
        client = dist.TCPStore(address, port, world_size, is_master=False)
    else:
        client = dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"titanpod/attempt-{attempt}", client)


def ensure_process_group(backend: CollectiveLane) -> ProcessInfo:
    """Join the job's default process group if not yet joined, and say where we stand.

    Under torchrun the rendezvous comes from its environment; a lone process gets a group
    of one on an in-memory store, so single-process code can use meshes and DTensors too.
    """
    info = process_info()
    if dist.is_initialized():
        return ProcessInfo(dist.get_rank(), info.local_rank, dist.get_world_size(), info.local_world_size)
    if "MASTER_ADDR" in os.environ and (store := attempt_store(os.environ)) is not None:
        store.set(f"member-{info.rank}", f"{socket.gethostname()} {os.getpid()}")  # who to look for if it is lost
        dist.init_process_group(backend=backend.dist_backend, store=store, rank=info.rank, world_size=info.world_size)
    elif "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend=backend.dist_backend)
    else:
        if info.world_size != 1:
            raise RuntimeError(
                f"WORLD_SIZE is {info.world_size} but MASTER_ADDR is unset: start multi-process "
                "jobs with torchrun (e.g. torchrun --nproc-per-node 4 ...)."
            )
        dist.init_process_group(backend=backend.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
    return ProcessInfo(dist.get_rank(), info.local_rank, dist.get_world_size(), info.local_world_size)
