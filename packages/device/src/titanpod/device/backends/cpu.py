"""The cpu lane: PyTorch on the host, gloo collectives, inductor compilation."""

from __future__ import annotations

import torch

from titanpod.device.backend import Backend
from titanpod.device.chips import ChipSpec
from titanpod.device.host_launch import HostLaunch
from titanpod.device.memory import MemoryStats, host_memory_stats, reset_host_peak
from titanpod.device.peak_cache import cached_cpu_peak


class CpuBackend(Backend):
    """PyTorch on the host CPU."""

    lane = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    compile_backend = "inductor"
    device_memory_is_host = True
    stand_in_lanes = ("cpu",)
    launch = HostLaunch(processes_per_host=1)

    def __init__(self) -> None:
        self._chip: ChipSpec | None = None

    def device(self, local_rank: int = 0) -> torch.device:
        """The host: every rank uses ``cpu``."""
        return torch.device("cpu")

    def device_count(self) -> int:
        """One: the host."""
        return 1

    def synchronize(self, local_rank: int = 0) -> None:
        """Nothing to wait for: CPU ops finish before they return."""

    def memory_stats(self, local_rank: int = 0) -> MemoryStats:
        """The process's resident set size, now and at its peak."""
        return host_memory_stats()

    def reset_peak_memory(self, local_rank: int = 0) -> None:
        """Start a new peak window for the process's resident memory (on Linux)."""
        reset_host_peak()

    def chip(self) -> ChipSpec:
        """The fp32 matmul peak of this CPU, measured once per machine (``titanpod.device.peak_cache``)."""
        if self._chip is None:
            self._chip = cached_cpu_peak()
        return self._chip
