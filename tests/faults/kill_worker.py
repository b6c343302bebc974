"""A process that saves trainer-state checkpoints and is SIGKILLed at seeded points of a save.

Run as ``python kill_worker.py ROOT MODE SEEDS...`` (MODE ``sync`` or ``async``). It imports
torch and titanpod once, then for each seed forks a child (no threads exist yet, so forking is
safe) that saves steps 1, 2, 3 ... into ``ROOT/<seed>/checkpoints`` and kills itself with SIGKILL
at one point of the save of step 3: the seed picks which of the Python and C calls the save makes
(file opens, writes, fsyncs, renames, the marker, the manifest) is the last one to run: even
seeds anywhere in the save, odd seeds in its last tenth (where the manifest, the marker, the
rename and the pruning of older checkpoints happen). Each
step's parameters are filled with the step number, so a reader can tell which step it loaded.
Prints one JSON line per seed: the steps the child reported saved, and the event it died at.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
from pathlib import Path

import torch

from titanpod.checkpoint import CheckpointConfig
from titanpod.checkpoint.trainer_state import Checkpointer
from titanpod.device import get_backend
from titanpod.graph import TrainConfig
from titanpod.graph.steps import build_step

KILLED_STEP = 3
"""The step whose save is cut short; steps 1 and 2 complete before it."""


class SmallModel(torch.nn.Module):
    """A few parameters, enough for several DCP items per file."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(32, 64)
        self.second = torch.nn.Linear(64, 32)


def fill(model: torch.nn.Module, step_number: int) -> None:
    """Every parameter of ``model`` set to ``step_number``: the state that step N's save holds."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float(step_number))


def build(root: Path, mode: str) -> tuple[Checkpointer, torch.nn.Module, object]:
    model = SmallModel()
    step = build_step(model, TrainConfig(steps=10, warmup_steps=0), get_backend("cpu"))
    config = CheckpointConfig(every=1, keep_last=2, async_save=mode == "async")
    checkpointer = Checkpointer(root, config, json.dumps({"name": "faults"}), say=lambda _: None)
    return checkpointer, model, step


class Tripwire:
    """Counts the calls a save makes (Python functions and C builtins) and SIGKILLs at the chosen one."""

    def __init__(self, kill_at: int | None) -> None:
        self.kill_at = kill_at
        self.events = 0
        self.lock = threading.Lock()

    def __call__(self, frame, event, arg):  # a sys.setprofile hook
        if event not in ("call", "c_call"):
            return
        with self.lock:
            self.events += 1
            if self.kill_at is not None and self.events >= self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        threading.setprofile(self)  # the background save's writer thread too
        sys.setprofile(self)

    def remove(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)


def save_steps(root: Path, mode: str, kill_at: int | None, report) -> int:
    """Save steps 1..KILLED_STEP; the last under the tripwire. Returns the events that save made."""
    checkpointer, model, step = build(root, mode)
    for step_number in range(1, KILLED_STEP + 1):
        fill(model, step_number)
        tripwire = Tripwire(kill_at) if step_number == KILLED_STEP else None
        if tripwire:
            tripwire.install()
        checkpointer.save(step_number, model, step, {"index": step_number})
        checkpointer.wait()
        if tripwire:
            tripwire.remove()
            return tripwire.events
        report(step_number)
    return 0


def main() -> None:
    root, mode, seeds = Path(sys.argv[1]), sys.argv[2], [int(s) for s in sys.argv[3:]]
    torch.set_num_threads(1)
    events = save_steps(root / "count", mode, None, lambda _: None)  # how many calls a whole save makes
    for seed in seeds:
        first = 1 if seed % 2 == 0 else events - events // 10
        kill_at = random.Random(seed).randrange(first, events + 1)
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read)

            def report(step_number: int, pipe: int = write) -> None:
                os.write(pipe, f"{step_number}\n".encode())

            save_steps(root / str(seed), mode, kill_at, report)
            os._exit(0)  # the kill point was past the save's last call: it completed
        os.close(write)
        _, status = os.waitpid(child, 0)
        with os.fdopen(read) as pipe:
            saved = [int(line) for line in pipe.read().split()]
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        trial = {"seed": seed, "kill_at": kill_at, "of": events, "killed": killed, "saved": saved}
        print(json.dumps(trial), flush=True)


if __name__ == "__main__":
    main()
