"""When a checkpoint is due by the clock: ``checkpoint.every_seconds`` after the first step or the last save
(the clock starts at the first step's end, so building and compiling, which a checkpoint does not keep, count for
nothing).

Each process reads its own clock, and the processes of a torchrun job agree (the largest of their answers) so
all of them save after the same step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from titanpod.graph.stop_agreement import StopAgreement


class SaveClock:
    """Says after each step whether ``seconds`` have passed since the last save, agreed through ``agreement``."""

    def __init__(self, seconds: float, agreement: StopAgreement, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.last_save: float | None = None
        self.agreement = agreement

    def due(self) -> bool:
        """Whether a save is due now on any process; every process calls this after the same steps (off at 0:
        no clock read, nothing agreed)."""
        if not self.seconds:
            return False
        if self.last_save is None:
            self.last_save = self.clock()
        return bool(self.agreement.largest(int(self.clock() - self.last_save >= self.seconds)))

    def saved(self) -> None:
        """A save was made: the next is due ``seconds`` from now."""
        self.last_save = self.clock()
