"""Whether the final weights fit in what is left of a stop signal's notice.

A preemptible Cloud TPU VM gets SIGTERM about 30 s before it is stopped (``checkpoint.notice_seconds``). After
the signal the trainer state is saved first; the final weights, which the resumed run that finishes writes
anyway, come after it only while the time left still covers a save as long as that checkpoint's (the weights
are a part of the trainer state, so they take no longer). Every process of a job decides alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from titanpod.graph import TrainSummary


def weights_left_out(
    summary: TrainSummary,
    notice_seconds: float,
    checkpoint_seconds: float,
    agree: Callable[[int], int],
    now: Callable[[], float] = time.monotonic,
) -> str | None:
    """Why the final weights are not written after the signal that stopped ``summary``'s run, or ``None`` to write
    them. ``checkpoint_seconds``: how long the checkpoint after the signal took; ``agree`` gives the largest value
    any process offers (every process must call this)."""
    if not summary.interrupted or summary.stop_received_at is None or not notice_seconds:
        return None
    left = notice_seconds - (now() - summary.stop_received_at)
    if not agree(int(left < checkpoint_seconds)):
        return None
    return (
        f"the final weights were left to the run that finishes it: {max(left, 0.0):.1f} s of the signal's "
        f"{notice_seconds:g} s notice were left and the checkpoint took {checkpoint_seconds:.1f} s "
        "(--checkpoint.notice-seconds sets the notice; 0 always writes them)"
    )
