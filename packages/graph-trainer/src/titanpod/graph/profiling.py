"""Profiling a range of training steps: a trace Perfetto and TensorBoard open, written into the run directory.

The cpu and cuda lanes trace with ``torch.profiler`` (a Chrome trace, ``rank<N>.<time>.pt.trace.json``); the
tpu lane with ``torch.profiler`` and torch_tpu's ``torch.tpu.profiler.TpuProfilerConfig``, which adds the TPU's
XProf trace (``plugins/profile/<time>/<host>_rank<N>.xplane.pb``); the xla lane with ``jax.profiler``
(``plugins/profile/<time>/``: an XProf trace and a Perfetto trace, ``*.trace.json.gz``). Every process traces
(each file is named by its rank); a single-controller lane has one process.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from titanpod.device import backend_class

STEP_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class ProfileConfig:
    """Which training steps to trace, and how much the trace records."""

    steps: str | None = None
    """Steps to trace, first and last included: ``5-7``, or one step: ``5``. ``None``: no profiling. The trace
    starts before the first step and is written after the last, into ``<run>/profile/``."""
    record_shapes: bool = False
    """Record the input shapes of every operator (torch lanes; a larger trace)."""
    profile_memory: bool = False
    """Record tensor allocations and frees (torch lanes; adds the memory view)."""
    with_stack: bool = False
    """Record the Python stack of every operator (torch lanes; a much larger, slower trace)."""

    def __post_init__(self) -> None:
        self.step_range()  # a malformed range fails when the recipe is made

    def step_range(self) -> tuple[int, int] | None:
        """``(first, last)`` steps to trace (1-based, both included), or ``None`` when profiling is off;
        ``ValueError`` names a malformed or reversed range."""
        if self.steps is None:
            return None
        match = STEP_RANGE.match(self.steps)
        if match is None:
            raise ValueError(
                f"profile.steps must be a step or a range of steps such as 5-7, got {self.steps!r}: "
                "give --profile.steps FIRST-LAST."
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if first < 1 or last < first:
            low, high = sorted((max(first, 1), max(last, 1)))
            raise ValueError(
                f"profile.steps {self.steps!r} is not a range of steps: the first must be 1 or more and not "
                f"after the last, e.g. --profile.steps {low}-{high}."
            )
        return first, last

    def check_fits(self, train_steps: int) -> None:
        """``ValueError`` when the range ends after the run's last step (``train.steps``)."""
        span = self.step_range()
        if span is not None and span[1] > train_steps:
            raise ValueError(
                f"profile.steps {self.steps!r} ends after the run's last step (train.steps={train_steps}): "
                f"trace steps up to {train_steps}, or raise --train.steps."
            )


class Trace(Protocol):
    """One lane's way to record a trace: started, marked at each step, stopped."""

    def start(self) -> None:
        """Begin recording."""
        ...

    def mark(self, step_number: int) -> AbstractContextManager[Any]:
        """A range in the trace around ``step_number`` (entered before the step, left after it)."""
        ...

    def stop(self) -> None:
        """Stop recording and write the trace files."""
        ...


class TorchTrace:
    """``torch.profiler`` on the process's activities (CPU, and CUDA or the tpu lane's device where present),
    with the lane's own extra option where its backend class has one (``profiler_config``)."""

    def __init__(self, config: ProfileConfig, folder: Path, rank: int, lane: str) -> None:
        import torch.profiler

        activities = sorted(torch.profiler.supported_activities(), key=lambda activity: activity.value)
        experimental = backend_class(lane).profiler_config(folder, rank)
        self._profiler = torch.profiler.profile(
            activities=activities,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(folder), worker_name=f"rank{rank}"),
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_stack=config.with_stack,
            experimental_config=experimental,
        )

    def start(self) -> None:
        """Begin recording."""
        self._profiler.start()

    def mark(self, step_number: int) -> AbstractContextManager[Any]:
        """A ``step N`` range on the CPU timeline."""
        import torch.profiler

        return torch.profiler.record_function(f"step {step_number}")

    def stop(self) -> None:
        """Stop; ``tensorboard_trace_handler`` writes ``rank<N>.<time>.pt.trace.json``."""
        self._profiler.stop()


class JaxTrace:
    """``jax.profiler`` for the xla lane: an XProf trace and a Perfetto trace under ``plugins/profile/``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def start(self) -> None:
        """Begin recording."""
        import jax.profiler

        jax.profiler.start_trace(str(self.folder), create_perfetto_trace=True)

    def mark(self, step_number: int) -> AbstractContextManager[Any]:
        """A ``train`` step annotation (``step_num`` N), as XProf's step view reads it."""
        import jax.profiler

        return jax.profiler.StepTraceAnnotation("train", step_num=step_number)

    def stop(self) -> None:
        """Wait for the device to finish what the traced steps dispatched, then stop and write the trace files.

        JAX dispatches a step and returns before the device has run it; stopping at once would keep only the
        device's first milliseconds of the traced steps."""
        import jax
        import jax.profiler

        jax.block_until_ready(jax.live_arrays())
        jax.profiler.stop_trace()


def lane_trace(config: ProfileConfig, folder: Path, rank: int, lane: str) -> Trace:
    """The trace for ``lane``: ``jax.profiler`` where its backend class traces with JAX (the xla lane),
    ``torch.profiler`` elsewhere."""
    if backend_class(lane).traces_with_jax:
        return JaxTrace(folder)
    return TorchTrace(config, folder, rank, lane)


class StepProfiler:
    """Traces the steps ``config.steps`` names: call ``before_step(n)`` before step n and ``after_step(n)``
    after it (a step outside the range does nothing), and ``close()`` when training ends, whatever happened
    (a trace cut short by a stop is still written)."""

    def __init__(
        self,
        config: ProfileConfig,
        folder: Path,
        lane: str,
        rank: int = 0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """Trace into ``folder`` (created when tracing starts) on ``lane``; ``say`` reports where the trace went."""
        span = config.step_range()
        if span is None:
            raise ValueError("StepProfiler needs profile.steps; leave the profiler out when profiling is off.")
        self.first, self.last = span
        self.config, self.folder, self.lane, self.rank = config, folder, lane, rank
        self._say = say or (lambda message: None)
        self._trace: Trace | None = None
        self._mark: AbstractContextManager[Any] | None = None
        self._traced: list[int] = []

    @property
    def active(self) -> bool:
        """True while a trace is recording."""
        return self._trace is not None

    def before_step(self, step_number: int) -> None:
        """Start tracing when ``step_number`` is the range's first (or, after a resume, any step within it),
        and open the step's range in the trace."""
        if not self.first <= step_number <= self.last or step_number in self._traced:
            return
        if self._trace is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._trace = lane_trace(self.config, self.folder, self.rank, self.lane)
            self._trace.start()
        self._mark = self._trace.mark(step_number)
        self._mark.__enter__()
        self._traced.append(step_number)

    def after_step(self, step_number: int) -> None:
        """Close the step's range; after the range's last step, stop and write the trace."""
        if self._trace is None:
            return
        self._close_mark()
        if step_number >= self.last:
            self.close()

    def close(self) -> None:
        """Stop a trace still recording and write it (nothing when none is)."""
        if self._trace is None:
            return
        self._close_mark()
        trace, self._trace = self._trace, None
        trace.stop()
        steps = f"{self._traced[0]}-{self._traced[-1]}" if len(self._traced) > 1 else str(self._traced[0])
        self._say(
            f"profile of step {steps} ({self.lane} lane) written to {self.folder}: open it with "
            f"tensorboard --logdir {self.folder} or at ui.perfetto.dev"
        )

    def _close_mark(self) -> None:
        if self._mark is not None:
            mark, self._mark = self._mark, None
            mark.__exit__(None, None, None)
