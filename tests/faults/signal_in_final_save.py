"""titanpod-pretrain that sends itself a signal as its final weights save begins.

``python signal_in_final_save.py SIGNALS ARGS...``: ``SIGNALS`` is a comma-separated list of names sent one after
the other (just past ``DUPLICATE_WINDOW_S`` apart, as a person or a scheduler would), to the main thread, once
the model's files are being written.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from titanpod.graph.interrupt import DUPLICATE_WINDOW_S
from titanpod.pretrain.cli import main
from titanpod.runs import final_weights


def signal_as_save_starts(signums: list[signal.Signals]) -> None:
    """Make the trainer's final save send ``signums`` to this process before it writes a byte."""
    save_model = final_weights.save_model

    def signalled_save(*args: Any, **kwargs: Any) -> Any:
        for index, signum in enumerate(signums):
            if index:
                time.sleep(DUPLICATE_WINDOW_S * 1.2)
            signal.pthread_kill(threading.main_thread().ident, signum)  # handled before it returns
        return save_model(*args, **kwargs)

    final_weights.save_model = signalled_save


if __name__ == "__main__":
    names, *args = sys.argv[1:]
    signal_as_save_starts([signal.Signals[name] for name in names.split(",")])
    sys.exit(main(args))
