"""Which ``StepCompiler`` a ``TrainConfig`` asks for on a lane (kept apart from the interface so that the
opt-in cached compiler, which implements the interface, is imported only where it is chosen)."""

from __future__ import annotations

from typing import Any

from titanpod.device import Backend
from titanpod.graph.step_compiler import BackendStepCompiler, StepCompiler, StepSource, cache_dir_of


def choose_step_compiler(config: Any, backend: Backend, source: StepSource) -> StepCompiler | None:
    """The compiler ``config`` (a ``TrainConfig``) asks for on ``backend``'s lane: ``None`` with ``compiler='none'``
    (the captured graph runs as it is), titanpod's cached compile with ``step_compiler='cached'`` where inductor
    compiles (it checks the torch version first), else the lane's own."""
    if config.compiler == "none":
        return None
    if config.step_compiler == "cached" and backend.compile_backend == "inductor":
        from titanpod.graph.cpu_compile.cached_compiler import CachedStepCompiler  # only the opt-in needs it

        return CachedStepCompiler(source, cache_dir_of(config.compile_cache_dir))
    return BackendStepCompiler(backend, config)
