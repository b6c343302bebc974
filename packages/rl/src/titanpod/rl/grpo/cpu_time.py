"""CPU time of this process, the figure a step's cost is read from on a machine other jobs share."""

from __future__ import annotations

import os


def process_cpu_seconds() -> float:
    """User + system CPU seconds of this process (every thread) and of its children that were waited for.

    Wall time on a shared machine grows with the other jobs' load; CPU time counts only the work this process
    (and the worker processes it started and reaped) did, so two trainers measured under different loads compare.
    """
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system
