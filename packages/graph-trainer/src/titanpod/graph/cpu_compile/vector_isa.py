"""Inductor's pick of CPU vector instructions, found without holding up the step's first call.

Inductor decides which vector instructions (AVX-512, AVX2, ...) its CPU kernels use by compiling
and running a small test program for each candidate the CPU lists, the first time a process
compiles or loads a kernel (0.4-1.9 s measured on a 2-core CPU with inductor's cache warm,
several seconds cold). A compiled step's cache key names the pick, and loading a compiled step
needs it too.

``VectorIsaProbe`` starts that check in a background thread, so it overlaps the capture of the
step. On x86 it runs the test program of the best candidate the CPU's flags list, alone: one
compile on one core (about 4 s cold here), leaving the other core to the capture; when that
builds and loads, the lesser candidates are taken from the flags, as the same CPU runs them and
the same compiler builds them. Where it fails, every candidate is checked, all at once rather
than one after another (5.8 s instead of 9.9 s cold here, on both cores). The outcome is
remembered in the compiled-step cache (``vector-isa.json``) under the CPU's flags, torch's
version and the C++ compiler. A later process on the same CPU asks inductor for the candidates
its flags allow without running the test programs (inductor's ``cpp.vec_isa_ok``) and keeps
that answer only when it equals the remembered outcome; otherwise the check runs as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from titanpod.device import cpu_features
from titanpod.graph.cpu_compile.compiled_steps import save_atomically

RECORD = "vector-isa.json"
"""The file in the compiled-step cache folder that remembers the check's outcome."""


class VectorIsaProbe:
    """Inductor's pick of vector instructions for this CPU (``str(pick_vec_isa())``), worked out in a background
    thread from construction; ``cache_dir`` (the compiled-step cache, or ``None``) remembers a real check's
    outcome for later processes."""

    def __init__(self, cache_dir: Path | None) -> None:
        self._cache_dir = cache_dir
        self._result: str | None = None
        self._checks = True
        self._decided = threading.Event()
        self._thread = threading.Thread(target=self._run, name="titanpod-vector-isa-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = pick(self._cache_dir, self._decide)
        except Exception:  # result() checks again in the caller's thread, where the error belongs
            self._result = None
        finally:
            self._decided.set()

    def _decide(self, checks: bool) -> None:
        self._checks = checks
        self._decided.set()

    def runs_check(self) -> bool:
        """Whether the pick takes inductor's test programs (seconds), because no earlier process on this machine
        remembered their outcome; known a moment after construction, long before the pick itself."""
        self._decided.wait()
        return self._checks

    def result(self) -> str:
        """The pick (waits for the background check; checks again here if it failed there)."""
        self._thread.join()
        return self._result if self._result is not None else pick(self._cache_dir)


def pick(cache_dir: Path | None, decided: Callable[[bool], None] | None = None) -> str:
    """Inductor's pick for this CPU: from the candidates the CPU's flags allow when ``cache_dir`` remembers a real
    check that found exactly those, else from inductor's own check (remembered in ``cache_dir`` afterwards);
    inductor's own answer as it is when ``TORCHINDUCTOR_VEC_ISA_OK`` (``cpp.vec_isa_ok``) is set. ``decided`` is
    told, before any test program runs, whether the check will run."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa, valid_vec_isa_list

    decided = decided if decided is not None else _ignore
    if config.cpp.vec_isa_ok is not None:  # the user decided (TORCHINDUCTOR_VEC_ISA_OK): inductor skips its check
        decided(False)
        return str(pick_vec_isa())
    record_path = cache_dir / RECORD if cache_dir is not None else None
    machine = _machine_key()
    remembered = _read(record_path).get(machine) if record_path is not None else None
    if remembered is not None:
        with config.patch({"cpp.vec_isa_ok": True}):
            by_flags = [str(isa) for isa in valid_vec_isa_list()]
        if by_flags == remembered:
            decided(False)
            return str(pick_vec_isa())
        valid_vec_isa_list.cache_clear()  # the flags promise more than the check found: check for real
    decided(True)
    if _best_candidate_builds():  # the lesser candidates, on the same CPU and compiler, are taken from the flags
        valid_vec_isa_list.cache_clear()
        with config.patch({"cpp.vec_isa_ok": True}):
            checked = [str(isa) for isa in valid_vec_isa_list()]  # kept: pick_vec_isa reads this list from now on
    else:
        _check_candidates_at_once()
        checked = [str(isa) for isa in valid_vec_isa_list()]
    if record_path is not None and remembered != checked:
        _remember(record_path, machine, checked)
    return str(pick_vec_isa())


def _ignore(checks: bool) -> None:
    """No one to tell whether the check runs."""


def _best_candidate_builds() -> bool:
    """Run inductor's check of the best candidate the x86 CPU's flags list, alone (one test program, one core, so
    the capture beside it keeps the other); ``False`` where it fails, or where the pick is not simply the best
    (``cpp.simdlen`` or ``ATEN_CPU_CAPABILITY`` set, or another architecture): those check every candidate."""
    from torch._inductor import config

    if config.cpp.simdlen is not None or os.environ.get("ATEN_CPU_CAPABILITY"):
        return False
    candidates = _x86_candidates()
    return bool(candidates) and bool(candidates[0])


def _check_candidates_at_once() -> None:
    """Run inductor's check of every candidate the CPU's flags list in its own thread (each compiles a test
    program in a subprocess), instead of one after another; inductor keeps each outcome for its own list."""
    threads = [threading.Thread(target=bool, args=(isa,), daemon=True) for isa in _x86_candidates()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _x86_candidates() -> list[Any]:
    """Inductor's vector-instruction candidates that the x86 CPU's flags list, best first (none elsewhere)."""
    from torch._inductor.cpu_vec_isa import supported_vec_isa_list, x86_isa_checker

    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    flags = x86_isa_checker()
    return [isa for isa in supported_vec_isa_list if all(flag in flags for flag in str(isa).split())]


def _machine_key() -> str:
    """What the check's outcome depends on: the CPU's flags, torch's build and the C++ compiler inductor calls."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    compiler = shutil.which(get_cpp_compiler()) or get_cpp_compiler()
    try:
        stat = os.stat(compiler)
        compiler_id = f"{os.path.realpath(compiler)}:{stat.st_size}:{stat.st_mtime_ns}"
    except OSError:
        compiler_id = compiler
    parts = [platform.machine(), cpu_features(), torch.__version__, torch.version.git_version, compiler_id]
    return hashlib.sha256("\0".join(str(part) for part in parts).encode()).hexdigest()


def _read(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _remember(path: Path, machine: str, checked: list[str]) -> None:
    """Add this machine's outcome to the record (a failure to write only loses the shortcut)."""
    record = _read(path)
    record[machine] = checked
    with contextlib.suppress(OSError):
        save_atomically(lambda partial: Path(partial).write_text(json.dumps(record)), path)
