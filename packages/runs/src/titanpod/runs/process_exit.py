"""A run's exit status, and leaving a torchrun rank once its run is written."""

from __future__ import annotations

import os
import signal
import sys

from titanpod.graph import TrainSummary
from titanpod.graph.interrupt import exit_status


def run_exit_code(summary: TrainSummary) -> int:
    """The exit status a training run deserves: 0 when it finished, 1 when it stopped on its own (a non-finite
    gradient), 128 + the signal number when a signal stopped it (130 for SIGINT, 143 for SIGTERM)."""
    if summary.stopped_because:
        return 1
    if summary.interrupted:
        return exit_status(summary.stop_signal or signal.SIGINT)
    return 0


def exit_rank(code: int) -> None:
    """End this process with ``code`` now, without the interpreter's teardown, once its work is written
    and its process group destroyed.

    Interpreter teardown after a gloo run occasionally aborts a rank ("terminate called without an
    active exception", a few runs in a hundred, not yet traced to its source), which would turn a
    finished run into a failed one; every file is closed by then, so the rank leaves without it.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
