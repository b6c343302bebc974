"""How a captured whole step becomes one program: the ``StepCompiler`` interface and its default.

The default on every lane is the lane's own compile of the captured graph (``Backend.compile_step``:
``torch.compile`` with inductor on the cpu and cuda lanes, inductor's own caches making a later run's
compile shorter). ``train.step_compiler='cached'`` picks ``titanpod.graph.cpu_compile``'s compiler on
the lanes inductor compiles for: the step kept whole in titanpod's compiled-step cache and loaded by a
later run without capturing it. It leans on inductor internals, so it is an opt-in module that
checks the torch version it runs on. (The xla lane compiles its step with ``jax.jit`` in
``titanpod.graph.xla`` and takes neither.)
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import fx, nn

from titanpod.device import Backend
from titanpod.graph.device_full import SaysWhenDeviceFull

Program = Callable[..., Any]
"""A compiled step: takes and returns what its captured graph does (nested lists of tensors)."""


@dataclass(frozen=True)
class CompileReport:
    """How the step's program was obtained."""

    seconds: float
    """Wall time to compile (or load) it; the capture before it is not counted."""
    cache: str
    """``hit`` (loaded from the cache), ``miss`` (compiled and saved) or ``off`` (compiled, not kept: the cache is
    off, or the folder could not be written)."""
    path: Path | None
    """The artifact's file when the cache is on (on the xla lane: the folder of JAX's cache)."""


@dataclass(frozen=True)
class StepSource:
    """What a whole step is made from besides its inputs: enough for a compiler to know the step before capturing
    it."""

    model: nn.Module
    """The model the step trains."""
    config: Any
    """The step's ``TrainConfig``."""
    device_type: str
    """The device type of the model's parameters (``cpu``, ``cuda``)."""
    decays: Sequence[float]
    """Each parameter's weight decay, in the step's order."""
    builders: tuple[Callable[..., Any], ...]
    """The functions the step's graph is captured and rewritten with."""


class StepCompiler(ABC):
    """Turns a captured whole step into a program; may find one an earlier run compiled before any capture."""

    def load(self, inputs: tuple) -> tuple[Program, CompileReport] | None:
        """A program an earlier run compiled for a step taking ``inputs``, found without capturing it; ``None``:
        capture the step and ``compile`` it."""
        return None

    @abstractmethod
    def compile(self, graph: fx.GraphModule, inputs: tuple) -> tuple[Program, CompileReport | None]:
        """``graph`` (the captured step, taking ``inputs``' structure) as a program, and how it was obtained
        (``None`` where the compile happens inside the program's first call and is not timed apart)."""


class BackendStepCompiler(StepCompiler):
    """The lane's own compile (``Backend.compile_step``): ``torch.compile`` with inductor on cpu and cuda."""

    def __init__(self, backend: Backend, config: Any) -> None:
        self._backend = backend
        self._config = config

    def compile(self, graph: fx.GraphModule, inputs: tuple) -> tuple[Program, CompileReport | None]:
        """The lane's compile of ``graph``; it runs on the program's first call, which says plainly when the device
        has no room for the program (``titanpod.graph.device_full``)."""
        return SaysWhenDeviceFull(self._backend.compile_step(graph), self._backend, self._config), None


def cache_dir_of(setting: str) -> Path | None:
    """The folder ``TrainConfig.compile_cache_dir`` names: ``default`` is ``$XDG_CACHE_HOME/titanpod/compiled-steps``
    (``~/.cache/titanpod/compiled-steps`` without it), ``off`` is none, anything else a path (``~`` expanded)."""
    if setting == "off":
        return None
    if setting == "default":
        root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(root) / "titanpod" / "compiled-steps"
    return Path(setting).expanduser()
