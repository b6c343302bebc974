"""SIGINT (Ctrl-C) and SIGTERM that wait for the step in flight, so weights are never left half-updated.

The first signal asks the run to stop after the step in flight; a second one (of either kind) raises
``KeyboardInterrupt`` at once, wherever the run is, so what the run holds then may be mid-step.

The same signal arriving again within ``DUPLICATE_WINDOW_S`` of its last arrival is one delivery, not a second
request: a signal sent to a process group (Ctrl-C in a terminal, a scheduler's or a VM shutdown's SIGTERM)
reaches the run directly and again through a wrapper that forwards it (``uv run``, not on a terminal, re-sends
each about 0.2 s later), and a shell or a scheduler may send it twice about 0.1 s apart: two sent 0.1 s apart
under ``uv run`` arrive at +0, +0.1, +0.2 and +0.4 s, one chain of copies. The window is timed from when each
signal arrived
(``titanpod.graph.signal_arrivals``), not from when its handler ran, which on a loaded machine may be seconds
later, after the step in flight.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from titanpod.graph.signal_arrivals import ArrivalClock

DUPLICATE_WINDOW_S = 0.25
"""A repeat of the first signal within this many seconds of its last arrival is the same delivery forwarded, not a
second request."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a run: Ctrl-C, and what schedulers and preemptible VMs send."""


@dataclass
class StopRequest:
    """The signals received while a run trains."""

    signum: int | None = None
    """The first signal received (``signal.SIGINT`` or ``signal.SIGTERM``); ``None`` while none came."""
    second_signum: int | None = None
    """The signal that stopped the run at once (the second one); ``None`` while none came."""
    received_at: float = 0.0
    """When the first signal arrived (``time.monotonic()``)."""
    last_arrival: float = 0.0
    """When the first signal, or its latest copy, arrived (``time.monotonic()``)."""

    @property
    def requested(self) -> bool:
        """True once a signal asked the run to stop after the step in flight."""
        return self.signum is not None

    def signal_at_once(self) -> int:
        """The signal behind a ``KeyboardInterrupt`` the run caught: the second one, else SIGINT (Ctrl-C
        where no handler could be set, or an interrupt raised by the code itself)."""
        return self.second_signum if self.second_signum is not None else signal.SIGINT


def signal_name(signum: int) -> str:
    """``SIGINT``, ``SIGTERM``, ... for a signal number."""
    return signal.Signals(signum).name


def exit_status(signum: int) -> int:
    """The exit status of a process stopped by ``signum``, as shells report it: 128 + the signal number
    (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + signum


@contextmanager
def stop_after_step() -> Iterator[StopRequest]:
    """Turn the first SIGINT or SIGTERM into a stop request; a second one raises ``KeyboardInterrupt`` at once.

    The previous handlers come back on leaving. Outside the main thread, where signal handlers cannot
    be set, the signals behave as usual (Ctrl-C raises ``KeyboardInterrupt`` at once).
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    with ArrivalClock() as clock:

        def handle(signum: int, frame: object) -> None:
            for arrived in clock.arrivals(signum):  # one handler call may stand for several arrivals
                if not request.requested:
                    request.signum, request.received_at, request.last_arrival = signum, arrived, arrived
                    continue
                if signum == request.signum and arrived - request.last_arrival < DUPLICATE_WINDOW_S:
                    request.last_arrival = arrived
                    continue  # the first signal again: forwarded by a wrapper, or sent twice
                request.second_signum = signum
                raise KeyboardInterrupt(f"a second signal ({signal_name(signum)}): stopping at once")

        previous = {signum: signal.signal(signum, handle) for signum in STOP_SIGNALS}
        try:
            yield request
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)  # None: set outside Python
