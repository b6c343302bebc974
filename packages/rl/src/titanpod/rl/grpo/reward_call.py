"""Calling a reward function with a time limit, and the reward failures a run cannot go on after.

A reward function is the user's code: it may wait for a remote judge that never answers, or call
``sys.exit``. Each call runs in a daemon thread that the run waits on for at most ``grpo.reward_timeout_s``.
A Python thread cannot be killed, so a call past its limit is left running (a daemon thread does not keep
the process alive) and the run stops: ``RewardTimeout``. A ``SystemExit`` from the function would end the
process with status 0, saving nothing and saying nothing; it comes back as ``RewardExit`` instead. Any other
exception is raised again in the calling thread, ``KeyboardInterrupt`` included (signals are the run's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

TIMEOUT_FLAG = "--grpo.reward-timeout-s"
"""The flag that sets how long one reward call may take."""


class RewardStop(Exception):
    """A reward failure the run cannot go on after; its message names the function, the sample and the fix."""


class PeerRewardStop(RewardStop):
    """A ``RewardStop`` in another process of the run: that process's output names the sample."""


class RewardTimeout(Exception):
    """A reward call that did not return within its limit (its thread is still running)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"no answer within {timeout_s:g} s")
        self.timeout_s = timeout_s


class RewardExit(Exception):
    """A reward call that raised ``SystemExit`` (``sys.exit`` in the function)."""

    def __init__(self, code: Any) -> None:
        super().__init__(f"sys.exit({code!r})")
        self.code = code


def call_with_timeout(function: Callable[[], T], timeout_s: float | None, name: str) -> T:
    """``function()``, run in a daemon thread named after ``name`` and waited on for at most ``timeout_s``
    seconds (``None``: as long as it takes). ``RewardTimeout`` past the limit, ``RewardExit`` for a
    ``SystemExit``; any other exception is raised again here."""
    outcome: list[tuple[bool, Any]] = []

    def call() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as error:  # handed to the waiting thread, which decides
            outcome.append((False, error))

    worker = threading.Thread(target=call, name=f"reward {name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not outcome:  # still running: it cannot be stopped, only left behind
        assert timeout_s is not None  # without a limit the join returns only once the call has
        raise RewardTimeout(timeout_s)
    returned, value = outcome[0]
    if returned:
        return value
    if isinstance(value, SystemExit):
        raise RewardExit(value.code) from value
    raise value


def failure_message(error: RewardTimeout | RewardExit, name: str, where: str) -> str:
    """What to tell the user about ``error`` of the reward function ``name`` on the sample ``where`` describes
    ("on prompt 1, completion 2 (...)"), with the fix."""
    if isinstance(error, RewardTimeout):
        return (
            f"the reward function {name} did not return within {error.timeout_s:g} s {where}. A call that hangs "
            "cannot be stopped, so the run cannot go on. Make the function return in time (give a remote judge's "
            f"request a timeout of its own), or allow each call longer with {TIMEOUT_FLAG} (now {error.timeout_s:g})."
        )
    return (
        f"the reward function {name} called sys.exit({error.code!r}) {where}, which would end the run without "
        "saving or saying why. Return a number (e.g. 0.0 for a wrong completion), or raise an exception to have "
        "the sample skipped."
    )
