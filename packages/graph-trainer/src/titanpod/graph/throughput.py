"""Tokens a second of a training loop: the one figure the progress bar, every report (``metrics.jsonl``,
TensorBoard, W&B) and the summary show.

tokens/s = the tokens of every step after the first / the seconds from the first step's end to now, less the
seconds spent outside training since then (the loop's ``after_step`` hook: validation and checkpoint saves).

The first step of a call (a run, or a resumed run) compiles and warms up, so it is left out, and the figure is
a running one: each report gives it as of that report, and the summary as of the last report (as of the loop's
end when steps ran after it, which only a stop by a signal does), so the summary is the last report's figure and
the bar's last figure. Before any later step has run (a report at step 1, with ``log_every`` 1) there is nothing
to count but the first step: the figure is then its tokens over its own time, compile included. Tokens are
every data rank's. ``elapsed_seconds`` is wall time, saves and validation included; the rate of the steps between
two reports follows from it where neither ran between them. A background save's writing overlaps the steps after
it and slows them, which the figure shows; only the time the loop waits in the hook is left out.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


class ThroughputMeter:
    """Counts a loop's tokens and times them (see the module docstring for what it measures).

    Call ``step_done`` after every step (after the first step the device has been waited for, so the measure
    starts from a finished step), ``report`` at every report, and ``overall`` at the end.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.started = clock()
        """When the loop began."""
        self._first_tokens = 0
        self._first_end: float | None = None
        self._after_first = 0
        self._last_report: float | None = None  # its figure
        self._since_report = False
        self._outside = 0.0

    @contextlib.contextmanager
    def outside_training(self) -> Iterator[None]:
        """Time spent in the block (validation, a checkpoint save) is left out of the figure once the first step
        has ended."""
        began = self._clock()
        try:
            yield
        finally:
            if self._first_end is not None:
                self._outside += self._clock() - began

    def step_done(self, tokens: int, first: bool) -> None:
        """Count a finished step's ``tokens`` (every data rank's); ``first``: this call's first step, whose end
        starts the measure."""
        self._since_report = True
        if first:
            self._first_tokens, self._first_end = tokens, self._clock()
        else:
            self._after_first += tokens

    def rate(self, at: float) -> float:
        """Tokens a second as of ``at`` (a ``time.perf_counter()`` reading); 0 before any step finished."""
        if self._first_end is None:
            return 0.0
        if self._after_first:
            timed = at - self._first_end - self._outside
            return self._after_first / timed if timed > 0 else 0.0
        timed = self._first_end - self.started
        return self._first_tokens / timed if timed > 0 else 0.0

    def report(self) -> tuple[float, float]:
        """Tokens a second now, and the seconds since the loop began; marks a report."""
        now = self._clock()
        self._last_report, self._since_report = self.rate(now), False
        return self._last_report, now - self.started

    def overall(self, end: float) -> float:
        """The figure of the last report, or as of ``end`` when steps ran after it (or there was none)."""
        if self._since_report or self._last_report is None:
            return self.rate(end)
        return self._last_report
