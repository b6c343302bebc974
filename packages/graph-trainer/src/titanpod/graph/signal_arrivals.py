"""When each signal arrived, as opposed to when its Python handler ran.

Python runs a signal's handler only when the main thread is back in the interpreter: after a long step on a
loaded machine, two signals sent 0.1 s apart can reach their handlers seconds apart, or as one. ``ArrivalClock``
hands ``signal.set_wakeup_fd`` one end of a socket pair, to which the interpreter writes each signal's number as it
arrives, and a thread of its own stamps each number read with ``time.monotonic()``: a handler then asks for the
arrivals of its signal.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections import deque
from types import TracebackType

WAIT_FOR_STAMP_S = 0.5
"""How long a handler waits for the stamping thread to read its signal (it runs while the handler waits)."""


class ArrivalClock:
    """Stamps every signal that has a Python handler with its arrival time, while open (a ``with`` block, on the
    main thread); the wakeup descriptor in use before is put back on leaving."""

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._arrivals: deque[tuple[int, float]] = deque()
        self._stamped = threading.Condition()
        self._previous_fd = -1
        self._thread = threading.Thread(target=self._stamp, name="signal-arrivals", daemon=True)

    def __enter__(self) -> ArrivalClock:
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        self._writer.close()  # the thread's read returns empty and it ends
        self._thread.join()
        self._reader.close()

    def arrivals(self, signum: int) -> list[float]:
        """The arrival times (``time.monotonic()``) of ``signum`` not asked for yet, oldest first; waits a moment
        for one when none is stamped yet, and gives ``[now]`` if none comes (a signal raised by the process
        itself before the clock opened)."""
        with self._stamped:
            if not any(number == signum for number, _ in self._arrivals):
                self._stamped.wait_for(lambda: any(n == signum for n, _ in self._arrivals), WAIT_FOR_STAMP_S)
            found = [at for number, at in self._arrivals if number == signum]
            rest = [(number, at) for number, at in self._arrivals if number != signum]
            self._arrivals.clear()
            self._arrivals.extend(rest)
        return found or [time.monotonic()]

    def _stamp(self) -> None:
        """The thread: read signal numbers as they are written and stamp them."""
        while True:
            try:
                data = self._reader.recv(64)
            except OSError:
                return
            if not data:
                return
            now = time.monotonic()
            with self._stamped:
                self._arrivals.extend((number, now) for number in data)
                self._stamped.notify_all()
