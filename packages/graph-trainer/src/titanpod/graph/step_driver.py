"""The one loop every training loop runs on: it calls a step for each step number and owns what happens
around it, the same for pretraining, SFT, diffusion and GRPO.

Around each step the driver owns: signals (SIGINT or SIGTERM lets the step in flight finish and stops the run;
a second signal stops at once), the agreement of every process on the step they stop after, the stop on a
non-finite loss or gradient norm, the profiler's range, and the hooks that run after a step (reports,
validation, checkpoints). What a step is, and what it reports, is the caller's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from titanpod.device import Backend
from titanpod.graph.interrupt import stop_after_step
from titanpod.graph.profiling import StepProfiler
from titanpod.graph.stop_agreement import StopAgreement


@dataclass(frozen=True)
class StepCheck:
    """What the driver reads of a finished step to stop on a non-finite one."""

    applied: bool
    """The update was applied (its gradient norm was finite)."""
    loss: float | None
    """The step's loss; ``None`` for a step that computed none."""
    grad_norm: float | None
    """The step's gradient norm (``None`` where the step took none)."""


StepRun = Callable[[int], Callable[[], StepCheck]]
"""Runs step ``n`` and returns how to read its check: the driver reads it (which may wait for the device) only
when it must stop on a non-finite step."""


@dataclass
class DriveOutcome:
    """How the driven steps ended."""

    interrupted: bool = False
    """A signal stopped the run before its last step."""
    stop_signal: int | None = None
    """The signal that stopped it: the first after a stop at a step's end, the second after a stop at once."""
    stopped_at_once: bool = False
    """The run stopped at once (a second signal, or a ``KeyboardInterrupt``), possibly inside a step."""
    stop_received_at: float | None = None
    """When the signal that stopped the run reached this process (``time.monotonic()``; the time of the
    agreement where another process received it)."""
    stopped_because: str | None = None
    """Why the run stopped on its own: a non-finite loss or gradient norm with ``skip_nonfinite`` off, or the
    caller's ``stop_reason``."""


def nonfinite_stop(step_number: int, check: StepCheck) -> str | None:
    """The stop message for a step whose update was not applied or whose loss is not finite; ``None`` otherwise."""
    if check.applied and (check.loss is None or math.isfinite(check.loss)):
        return None
    found = (
        f"the loss is {check.loss} (gradient norm {check.grad_norm})"
        if check.applied
        else f"the gradient norm is {check.grad_norm} (loss {check.loss}); the update was not applied"
    )
    return (
        f"step {step_number}: {found} and the run stopped. Lower train.lr, raise train.warmup_steps, or set "
        "train.skip_nonfinite=True to skip such steps."
    )


def drive_steps(
    run_step: StepRun,
    first: int,
    last: int,
    backend: Backend,
    *,
    skip_nonfinite: bool,
    after_step: Callable[[int], None] | None = None,
    profiler: StepProfiler | None = None,
    stop_reason: Callable[[int], str | None] | None = None,
) -> DriveOutcome:
    """Run steps ``first`` to ``last`` with ``run_step``; after each, stop on a non-finite one (unless
    ``skip_nonfinite``: the step then only counts as skipped, which is the caller's), close the profiler's
    range, stop where ``stop_reason(n)`` gives a reason (read whatever ``skip_nonfinite`` says; every process must
    give the same), run ``after_step(n)`` and ask ``stop_reason(n)`` again (what ``after_step`` found, a save that
    failed, stops the run after that step), then agree with every process on whether a signal stops the run here.

    A stop at a step's end comes back as ``interrupted``; a second signal (or Ctrl-C outside the main thread)
    as ``stopped_at_once``. The profiler is closed whatever happened, so a trace cut short is still written.
    """
    outcome = DriveOutcome()
    agreement = StopAgreement(backend)
    with stop_after_step() as stop:
        try:
            if profiler is not None:
                profiler.before_step(first)
            for step_number in range(first, last + 1):
                read_check = run_step(step_number)
                if profiler is not None:
                    profiler.after_step(step_number)  # the trace ends with the step, before reports and saves
                if stop_reason is not None:
                    outcome.stopped_because = stop_reason(step_number)
                if outcome.stopped_because is None and not skip_nonfinite:
                    outcome.stopped_because = nonfinite_stop(step_number, read_check())
                if outcome.stopped_because is not None:
                    break
                if after_step is not None:
                    after_step(step_number)
                    if stop_reason is not None and (found := stop_reason(step_number)) is not None:
                        outcome.stopped_because = found
                        break
                if profiler is not None and step_number < last:
                    profiler.before_step(step_number + 1)
                signum = agreement.signal(stop)  # every process stops after the same step
                if signum is not None and step_number < last:
                    outcome.interrupted, outcome.stop_signal = True, signum
                    outcome.stop_received_at = stop.received_at if stop.requested else time.monotonic()
                    break
        except KeyboardInterrupt:  # a second signal, Ctrl-C outside the main thread: maybe inside a step
            outcome.interrupted, outcome.stop_signal, outcome.stopped_at_once = True, stop.signal_at_once(), True
        finally:
            if profiler is not None:
                profiler.close()
    return outcome
