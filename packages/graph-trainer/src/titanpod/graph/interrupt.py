"""Ctrl-C that waits for the step in flight, so weights are never left half-updated."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class StopRequest:
    """Set when the user asked the run to stop."""

    requested: bool = False
    """True after the first Ctrl-C."""


@contextmanager
def stop_after_step() -> Iterator[StopRequest]:
    """Turn the first Ctrl-C (SIGINT) into a stop request; a second one interrupts at once.

    Outside the main thread, where signal handlers cannot be set, Ctrl-C behaves as usual.
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handle(signum: int, frame: object) -> None:
        if request.requested:
            raise KeyboardInterrupt
        request.requested = True

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield request
    finally:
        signal.signal(signal.SIGINT, previous)
