"""What a rank says when the job loses another rank: which one, and the checkpoint a restart resumes from.

A rank that dies (a lost host, an out-of-memory kill, ``kill -9``) closes its connections, and every other
rank's next collective fails with a backend error that names an address, not a rank. Every rank recorded
its host and pid on the job's key-value store when it joined (``titanpod.device.distributed``), so a
survivor finds the lost ranks of its own host by their pids. Where none of its host is gone (the lost rank
was on another host), the survivors check in and the ranks that did not within a few seconds are named as
not answering. One survivor speaks, whichever claims it first on the store. torchrun's agent stops the
survivors with SIGTERM moments later, so all this holds that signal back until it is done.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from titanpod.device.distributed import attempt_store

LOST_PEER_TEXT = ("closed by peer", "reset by peer", "broken pipe", "connection refused", "communicator was aborted")
"""Backend error texts (gloo's, NCCL's) that mean another rank went away."""
CHECK_IN_WAIT_S = 3.0
"""How long a survivor that finds no lost rank on its own host waits for the others to check in."""
STORE_TIMEOUT = timedelta(seconds=10)
"""The longest wait on the job's store (it may have gone with the lost host)."""


def say_anywhere(message: str) -> None:
    """Print ``message`` on this rank's standard error (any rank: rank 0 may be the one lost)."""
    print(message, file=sys.stderr, flush=True)


def lost_a_peer(error: BaseException) -> bool:
    """True when ``error`` is a collective that failed because another rank went away."""
    text = str(error).lower()
    return isinstance(error, dist.DistError | RuntimeError) and any(part in text for part in LOST_PEER_TEXT)


@contextmanager
def sigterm_held() -> Iterator[None]:
    """Run the block with SIGTERM held back (it is delivered, by default action, on leaving)."""
    received: list[int] = []
    try:
        previous = signal.signal(signal.SIGTERM, lambda signum, _frame: received.append(signum))
    except ValueError:  # not the main thread: nothing can be held back
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            os.kill(os.getpid(), signal.SIGTERM)


def process_gone(pid: int) -> bool:
    """True when process ``pid`` of this host has exited (a zombie not yet collected counts as gone)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def lost_on_this_host(store: dist.Store, world_size: int) -> list[int]:
    """The ranks that joined from this host and whose process is gone."""
    host = socket.gethostname()
    lost = []
    for rank in range(world_size):
        if not store.check([f"member-{rank}"]):
            continue
        member_host, pid = store.get(f"member-{rank}").decode().rsplit(" ", 1)
        if member_host == host and process_gone(int(pid)):
            lost.append(rank)
    return lost


def not_answering(store: dist.Store, rank: int, world_size: int, wait_s: float) -> list[int]:
    """Check in as a survivor, wait ``wait_s``, and return the ranks that did not check in."""
    store.set(f"peer-loss-survivor-{rank}", "1")
    time.sleep(wait_s)
    return [other for other in range(world_size) if not store.check([f"peer-loss-survivor-{other}"])]


def lost_ranks(store: dist.Store, rank: int, world_size: int, wait_s: float = CHECK_IN_WAIT_S) -> tuple[str, bool]:
    """What to call the lost ranks, and whether this rank is the one to say it."""
    gone = lost_on_this_host(store, world_size)
    if gone:
        return f"rank {', '.join(map(str, gone))}", store.add("peer-loss-spoken", 1) == 1
    silent = not_answering(store, rank, world_size, wait_s)
    named = f"rank {', '.join(map(str, silent))} (not answering)" if silent else "a rank (it is not known which)"
    return named, store.add("peer-loss-spoken", 1) == 1


def report_lost_peer(
    error: BaseException,
    rank: int,
    world_size: int,
    newest_checkpoint: Callable[[], str | None],
    say: Callable[[str], None],
    environ: Mapping[str, str] = os.environ,
) -> None:
    """When ``error`` means the job lost a rank: one survivor says which ranks were lost and the newest
    complete checkpoint (through ``say``, which prints whatever the rank). Other errors pass silently."""
    if world_size < 2 or not lost_a_peer(error):
        return
    with sigterm_held():
        lost, speaks = "a rank (it is not known which)", True
        try:
            base = attempt_store(environ, timeout=STORE_TIMEOUT)
            if base is not None:
                lost, speaks = lost_ranks(base, rank, world_size)
        except (RuntimeError, ValueError, KeyError):  # DistError is a RuntimeError
            pass  # the store went with the host that kept it: say what is known
        if not speaks:
            return
        checkpoint = newest_checkpoint()
        resume = (
            f"newest complete checkpoint {checkpoint}: titanpod-launch --max-restarts N resumes from it by itself; "
            "by hand, run the same command again (same --output.run-name)"
            if checkpoint
            else "no complete checkpoint yet: a restart begins at step 1"
        )
        reason = str(error).splitlines()[0][:160]
        say(f"titanpod: the job lost {lost} of {world_size} ranks (rank {rank} saw: {reason}); {resume}")
