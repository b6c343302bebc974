"""Memory statistics in one shape for every lane."""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryStats:
    """Memory use of the device a process drives, in bytes."""

    current_bytes: int | None
    """Bytes in use now; ``None`` when the lane cannot tell (``kind`` is ``unavailable``)."""
    peak_bytes: int | None
    """Most bytes in use since the start (or since the last reset, where the lane has one); ``None`` when unknown."""
    limit_bytes: int | None
    """Capacity of the device, when known."""
    kind: str
    """``device`` for accelerator memory, ``host`` for the process's resident set, ``unavailable``
    where the accelerator does not report its memory (never host figures in its place)."""
    reason: str = ""
    """Why the figures are unavailable (empty otherwise)."""

    @property
    def peak_gib(self) -> float | None:
        """``peak_bytes`` in GiB; ``None`` when unavailable."""
        return None if self.peak_bytes is None else self.peak_bytes / 1024**3

    def as_gib(self) -> dict[str, float | None]:
        """The figures in GiB, for printing and logs (``None`` for those not known)."""
        gib = 1024**3
        return {
            "current_gib": None if self.current_bytes is None else self.current_bytes / gib,
            "peak_gib": self.peak_gib,
            "limit_gib": None if self.limit_bytes is None else self.limit_bytes / gib,
        }


def unavailable_memory_stats(reason: str, limit_bytes: int | None = None) -> MemoryStats:
    """Statistics of a device that does not report its memory use: no figures, and why."""
    return MemoryStats(None, None, limit_bytes, "unavailable", reason)


def accelerator_memory_stats(stats: Mapping[str, int]) -> MemoryStats:
    """A JAX device's ``memory_stats()`` in titanpod's shape.

    On a TPU a compiled program's temporaries are reserved apart from the allocator's buffers: they show in
    ``bytes_reserved``, not in ``bytes_in_use`` (seen on a v5e: a program with 3 GiB of temporaries left
    ``bytes_in_use`` at its 1 GiB argument and reserved 3 GiB). So both count: in use now is buffers plus
    reservations, and the peak is the buffers now plus the reservations at their peak, or the allocator's own
    peak of buffers where that is higher (e.g. while a checkpoint copies the state).
    """
    in_use = int(stats.get("bytes_in_use", 0))
    reserved = int(stats.get("bytes_reserved", 0))
    peak = max(int(stats.get("peak_bytes_in_use", in_use)), in_use + int(stats.get("peak_bytes_reserved", reserved)))
    limit = stats.get("bytes_limit")
    return MemoryStats(in_use + reserved, peak, None if limit is None else int(limit), "device")


def host_memory_stats() -> MemoryStats:
    """The process's resident memory now and at its peak (since ``reset_host_peak``, where Linux allows it)."""
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    current = resident_pages * os.sysconf("SC_PAGE_SIZE")
    peak = _high_water_mark()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return MemoryStats(current, max(peak, current), total, "host")


def _high_water_mark() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux; never reset


def reset_host_peak() -> bool:
    """Start a new peak-resident-memory window (Linux ``clear_refs``); False where the OS does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True
