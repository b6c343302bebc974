"""titanpod-pretrain that signals itself as a step starts: ``python signalling_pretrain.py STEP SIGNALS ARGS...``.

``SIGNALS`` is a comma-separated list of names (``SIGTERM``, ``SIGINT,SIGINT``), sent one after the other as
a person would (just past ``DUPLICATE_WINDOW_S`` apart: closer, a repeat is one forwarded delivery), once
step ``STEP``'s batch has been fetched and before the step runs: the moment at which a second signal used to
leave a checkpoint whose data position was one batch ahead of its step. Each is sent to the main thread, so
its handler has run before the next is sent.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from titanpod.graph import loop
from titanpod.graph.interrupt import DUPLICATE_WINDOW_S
from titanpod.pretrain.cli import main


def signal_when_step_starts(step: int, signums: list[signal.Signals]) -> None:
    """Make the loop send ``signums`` to this process when it takes step ``step``'s learning rate."""
    schedule = loop.lr_multiplier

    def lr_multiplier(step_number: int, config: Any) -> float:
        if step_number == step:
            for index, signum in enumerate(signums):
                if index:
                    time.sleep(DUPLICATE_WINDOW_S * 1.2)
                signal.pthread_kill(threading.main_thread().ident, signum)  # handled before it returns
        return schedule(step_number, config)

    loop.lr_multiplier = lr_multiplier


if __name__ == "__main__":
    step, names, *args = sys.argv[1:]
    signal_when_step_starts(int(step), [signal.Signals[name] for name in names.split(",")])
    sys.exit(main(args))
