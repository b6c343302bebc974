"""Memory statistics in one shape for every lane."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryStats:
    """Memory use of the device a process drives, in bytes."""

    current_bytes: int
    """Bytes in use now."""
    peak_bytes: int
    """Most bytes in use since the start (or since the last reset, where the lane has one)."""
    limit_bytes: int | None
    """Capacity of the device, when known."""
    kind: str
    """``device`` for accelerator memory, ``host`` for the process's resident set."""

    def as_gib(self) -> dict[str, float | None]:
        """The figures in GiB, for printing and logs."""
        gib = 1024**3
        return {
            "current_gib": self.current_bytes / gib,
            "peak_gib": self.peak_bytes / gib,
            "limit_gib": None if self.limit_bytes is None else self.limit_bytes / gib,
        }


def host_memory_stats() -> MemoryStats:
    """The process's resident memory now and at its peak (the OS keeps the peak; no reset)."""
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    current = resident_pages * os.sysconf("SC_PAGE_SIZE")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return MemoryStats(current, max(peak, current), total, "host")
