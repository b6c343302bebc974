"""JAX's persistent compilation cache for the xla lane's step, and a report of each compile.

``train.compile_cache_dir`` names one folder for every lane: the cpu and cuda lanes keep
inductor's compiled steps there (``titanpod.graph.cpu_compile``), the xla lane points
JAX's own persistent cache at its ``xla`` subfolder, so a second run of the same recipe loads
the step's executable instead of compiling it. JAX keeps that setting per process: pointing
it at another folder resets JAX's cache first (what its ``reset_cache`` is for), so the
latest step built in a process decides where its compiles go.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from titanpod.graph.step_compiler import CompileReport, cache_dir_of

HIT_EVENT = "/jax/compilation_cache/cache_hits"
"""What JAX records when an executable comes from the persistent cache instead of the compiler."""


def xla_cache_dir(setting: str) -> Path | None:
    """The folder JAX's cache uses for ``TrainConfig.compile_cache_dir`` = ``setting`` (None for ``off``)."""
    folder = cache_dir_of(setting)
    return None if folder is None else folder / "xla"


def use_xla_cache(folder: Path | None) -> Path | None:
    """Point JAX's persistent compilation cache at ``folder`` (created if missing), or switch it off (None).

    Returns the folder in use: None when it was off, or when ``folder`` cannot be made (a warning says so and
    the run compiles without a cache, as the inductor lanes do when they cannot save).
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            warnings.warn(
                f"The compiled-step cache folder {folder} cannot be made ({error}); this run compiles its step "
                "without it. Set train.compile_cache_dir to a folder you can write, or 'off'.",
                stacklevel=2,
            )
            folder = None
    wanted = None if folder is None else str(folder)
    if jax.config.jax_compilation_cache_dir != wanted:
        compilation_cache.reset_cache()  # JAX opens its cache once per process; a new folder needs a fresh start
        jax.config.update("jax_compilation_cache_dir", wanted)
    return folder


@contextlib.contextmanager
def _counting(event: str) -> Iterator[list[int]]:
    """Count how often JAX records ``event`` inside the block (the count is the list's one element)."""
    import jax.monitoring

    count = [0]

    def listener(name: str, **_: Any) -> None:
        if name == event:
            count[0] += 1

    jax.monitoring.register_event_listener(listener)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_listener(listener)


def compile_lowered(lower: Callable[[], Any], folder: Path | None) -> tuple[Any, CompileReport]:
    """Lower (``lower()``, a ``jax.stages.Lowered``) and compile a program, timing both; the report says ``hit``
    when JAX loaded the executable from its persistent cache in ``folder``, ``miss`` when it compiled it there,
    and ``off`` without a folder."""
    started = time.perf_counter()
    with _counting(HIT_EVENT) as hits:
        compiled = lower().compile()
    cache = "off" if folder is None else ("hit" if hits[0] else "miss")
    return compiled, CompileReport(time.perf_counter() - started, cache, folder)
