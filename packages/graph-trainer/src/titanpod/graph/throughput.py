"""Tokens a second of a training loop, in report windows and over the whole call, leaving out the first step
(it compiles and warms up)."""

from __future__ import annotations

import time


class ThroughputMeter:
    """Counts a loop's tokens and times them.

    Call ``step_done`` after every step (after the first step the device has been waited for, so the window
    starts from a finished step), ``window`` at every report, and ``overall`` at the end.
    """

    def __init__(self) -> None:
        self.started = time.perf_counter()
        """When the loop began."""
        self._since_report = 0
        self._after_first = 0
        self._last_report = self.started
        self._measured_from = self.started

    def step_done(self, tokens: int, first: bool, reporting: bool) -> None:
        """Count a finished step's ``tokens`` (every data rank's). ``first``: this call's first step, whose end
        starts the overall measure and, unless it is reported alone, the first report's window."""
        self._since_report += tokens
        if first:
            self._measured_from = time.perf_counter()
            if not reporting:
                self._since_report, self._last_report = 0, self._measured_from
        else:
            self._after_first += tokens

    def window(self, first: bool) -> tuple[float, float]:
        """Tokens a second since the last report, and the seconds since the loop began at this report (the
        window's end, so consecutive reports' times bound their windows exactly); starts the next window.
        ``first``: the report is of the first step alone, so the overall measure starts after it."""
        now = time.perf_counter()
        tps = self._since_report / (now - self._last_report)
        self._since_report, self._last_report = 0, now
        if first:
            self._measured_from = now
        return tps, now - self.started

    def overall(self, end: float) -> float:
        """Tokens a second over every step but the first, up to the last report (to ``end`` when steps ran after
        it); 0 when there were none."""
        until = end if self._since_report else self._last_report
        timed = until - self._measured_from
        return self._after_first / timed if self._after_first and timed > 0 else 0.0
