"""Two signals about 0.1 s apart (a shell or a scheduler sending SIGTERM twice) are one request, timed from when
each arrived, not from when its handler ran: the second one arrives while the main thread is inside a long call
that holds the interpreter back (as a training step does), and its handler runs only after it. A second signal
that arrives later than the window still stops at once."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import pytest

from titanpod.graph.interrupt import DUPLICATE_WINDOW_S, stop_after_step


def a_long_call() -> None:
    """Work that releases the interpreter lock and runs no signal handler until it returns (as a step's kernels)."""
    hashlib.pbkdf2_hmac("sha256", b"step", b"salt", 8_000_000)


def send_twice(gap_s: float) -> subprocess.Popen:
    """SIGTERM to this process, then again ``gap_s`` later, from another process."""
    return subprocess.Popen(["sh", "-c", f"kill -TERM {os.getpid()}; sleep {gap_s}; kill -TERM {os.getpid()}"])


def wait_for_request(request) -> None:
    while not request.requested:
        time.sleep(0.001)  # the first handler runs here, at once


def test_two_signals_a_tenth_of_a_second_apart_are_one_request_though_the_second_handler_runs_late():
    with stop_after_step() as request:
        sender = send_twice(0.1)
        wait_for_request(request)
        a_long_call()  # the second SIGTERM arrives in here; its handler runs after
        sender.wait()
        time.sleep(0.01)  # any handler still pending runs here
    assert request.signum == signal.SIGTERM and request.second_signum is None


def test_a_second_signal_after_the_window_stops_at_once():
    with stop_after_step() as request:
        sender = send_twice(DUPLICATE_WINDOW_S + 0.5)
        wait_for_request(request)
        with pytest.raises(KeyboardInterrupt, match="a second signal"):
            a_long_call()
            sender.wait()
            time.sleep(1.0)
    assert request.second_signum == signal.SIGTERM
