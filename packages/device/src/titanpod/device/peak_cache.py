"""This machine's CPU peak, measured once and kept: MFU on a CPU divides by a figure that does not move with
how busy the machine was when a run started.

The figure lives in ``cpu-peak.json`` under ``$XDG_CACHE_HOME/titanpod`` (``~/.cache/titanpod`` without it),
one entry per machine key: the CPU model, its core count, the threads PyTorch uses and the torch version, since
each changes what a matmul gets. The file is written whole or not at all (a temporary file renamed over it), a
file that cannot be read is measured again and replaced, and a folder that cannot be written to costs only the
cache: the run gets the figure it measured. Delete the file to measure again (on an idle machine).

A figure measured while the machine was busy is too low, and every later MFU too high: on a 2-core host a peak
measured beside a test run read 132 GFLOP/s, the same host idle 190, and the default run's MFU 97% against 56%.
So each figure is kept with the machine's load when it was measured (the 1-minute load average a core), and
one measured on a busy machine (``BUSY_LOAD`` or more) is measured again by a run that finds the machine at
under half that load; the higher of the two is kept, since a peak can only be underestimated by load.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from titanpod.device.chips import CPU_PEAK_METHOD, ChipSpec, host_memory_bytes, measure_cpu_peak
from titanpod.device.cpu_features import cpu_model

PEAK_FILE = "cpu-peak.json"
"""The cache file's name inside the cache folder."""

PEAK_MEASURE_VERSION = "measure 2"
"""Names the way the peak is measured, in every key: figures measured an older way (by wall clock alone, too
low when the machine was busy) are not read."""

PEAK_SECONDS = 1.0
"""How long the one measurement of a machine runs its matmuls (the best single call is kept)."""

BUSY_LOAD = 0.5
"""The load a core (1-minute load average over the cores) at or above which a measured peak counts as taken on a
busy machine, and is measured again once the machine is at under half its load then."""


def load_per_core() -> float | None:
    """The 1-minute load average over this machine's cores; ``None`` where the system does not report it."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return None


def peak_cache_path() -> Path:
    """``$XDG_CACHE_HOME/titanpod/cpu-peak.json``, else ``~/.cache/titanpod/cpu-peak.json``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "titanpod" / PEAK_FILE


def machine_key() -> str:
    """What a cached peak is valid for: CPU model, cores, PyTorch's threads, the torch version and the way it
    was measured (``PEAK_MEASURE_VERSION``)."""
    import torch

    return (
        f"{cpu_model()}; {os.cpu_count()} cores; {torch.get_num_threads()} threads; torch {torch.__version__}; "
        f"{PEAK_MEASURE_VERSION}"
    )


def cached_cpu_peak(
    measure: Callable[[], ChipSpec] | None = None,
    path: Path | None = None,
    key: str | None = None,
    load: Callable[[], float | None] = load_per_core,
) -> ChipSpec:
    """This CPU as a ``ChipSpec`` whose peak was measured for this machine and kept in ``path``.

    ``measure`` makes the measurement when ``path`` (default ``peak_cache_path()``) holds none for ``key``
    (default ``machine_key()``), holds one that cannot be read, or holds one measured on a busy machine
    (``load()`` then at ``BUSY_LOAD`` or more a core) while the machine is now at under half that load; default
    ``measure_cpu_peak`` for ``PEAK_SECONDS``. The higher of a kept and a new figure is kept. The spec's
    ``peak_method`` names the method and the file, so the figure can be traced and measured again.
    """
    path = peak_cache_path() if path is None else path
    key = machine_key() if key is None else key
    entries = _read_entries(path)
    entry = entries.get(key)
    kept_peak = float(entry["peak_flops"]) if isinstance(entry, dict) and _positive(entry.get("peak_flops")) else None
    now = load()
    if kept_peak is not None and not _quieter_now(entry.get("load_per_core"), now):
        return _spec(kept_peak, f"{CPU_PEAK_METHOD} on {entry.get('measured_on', '?')}", path)
    measured = (measure or (lambda: measure_cpu_peak(seconds=PEAK_SECONDS)))()
    if kept_peak is not None and kept_peak >= measured.peak_flops:
        entry["load_per_core"] = now  # measured again no higher: the kept figure holds at this load
        _write_entries(path, entries)
        return _spec(kept_peak, f"{CPU_PEAK_METHOD} on {entry.get('measured_on', '?')}", path)
    day = time.strftime("%Y-%m-%d")
    entries[key] = {"peak_flops": measured.peak_flops, "measured_on": day, "load_per_core": now}
    kept = _write_entries(path, entries)
    where = path if kept else None
    return _spec(measured.peak_flops, f"{CPU_PEAK_METHOD} on {day}", where)


def _quieter_now(then: Any, now: float | None) -> bool:
    """Whether a figure measured at load ``then`` (a core) was taken on a busy machine that is now at under half
    that load: worth measuring again."""
    return _positive(then) and then >= BUSY_LOAD and now is not None and now < then / 2


def _spec(peak_flops: float, method: str, path: Path | None) -> ChipSpec:
    kept = f"kept in {path}; delete it to measure again" if path is not None else "not kept: the cache is unwritable"
    return ChipSpec("cpu", peak_flops, host_memory_bytes(), measured=True, peak_method=f"{method} ({kept})")


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0 and value != float("inf")


def _read_entries(path: Path) -> dict[str, Any]:
    """The file's entries by machine key; empty when there is no file or it is not what this module writes."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    machines = data.get("machines") if isinstance(data, dict) else None
    return dict(machines) if isinstance(machines, dict) else {}


def _write_entries(path: Path, entries: dict[str, Any]) -> bool:
    """Write ``entries`` to ``path`` through a temporary file renamed over it; False when that fails."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError:
        return False
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump({"machines": entries}, file, indent=2)
        os.replace(staging, path)
    except OSError:
        Path(staging).unlink(missing_ok=True)
        return False
    return True
