"""One writer per run directory: a lock file that rank 0 holds for the run's whole life.

``<run>/run.lock`` records who holds it (pid, host, since when, as JSON) and is ``flock``-ed by the holder
as long as it lives; the kernel drops that lock when the process ends, however it ends. A second run of
the same directory is refused, naming the holder. A lock whose process is gone (a run killed with
SIGKILL, or a crashed rank 0 that torchrun restarts) is stale: the next run of this host takes it over
and says so. A lock written on another host is refused as long as its file is there, since this host
cannot see whether that process lives: remove the file once that host is gone. Where the file system
has no ``flock``, a lock of this host counts as held while its pid is alive.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from titanpod.runs.peer_loss import process_gone

LOCK_FILE = "run.lock"
"""The lock file in a run directory, there while a run writes into it."""


class RunLockedError(RuntimeError):
    """The run directory is held by another run: names it, the holder and what to do."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run directory, as its lock file records it."""

    pid: int
    """The holder's process id."""
    host: str
    """The host the holder runs on (``socket.gethostname()``)."""
    since: str
    """When it took the lock (UTC, ``YYYY-mm-ddTHH:MM:SSZ``)."""

    def describe(self) -> str:
        """``pid 123 on host-a since 2025-01-02T03:04:05Z``."""
        return f"pid {self.pid} on {self.host} since {self.since}"


def this_process() -> LockHolder:
    """This process as a lock holder, from now."""
    return LockHolder(os.getpid(), socket.gethostname(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


class RunLock:
    """The held lock of one run directory; ``release`` (or the process's end) gives it back."""

    def __init__(self, path: Path, descriptor: int, holder: LockHolder) -> None:
        self.path = path
        """The lock file."""
        self.holder = holder
        """This process, as the file records it."""
        self._descriptor: int | None = descriptor

    @classmethod
    def acquire(cls, run_dir: Path, say: Callable[[str], None]) -> RunLock:
        """Take the lock of ``run_dir`` (which must exist), taking over a stale one with a line to ``say``.

        ``RunLockedError`` when a live process holds it, or a process of another host does.
        """
        path = Path(run_dir) / LOCK_FILE
        for _ in range(10):  # the file may be removed or replaced between its opening and its locking
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                lock = cls._take(run_dir, path, descriptor, say)
            except BaseException:
                os.close(descriptor)
                raise
            if lock is not None:
                return lock
            os.close(descriptor)
        raise RunLockedError(f"Could not take the lock {path}: the file kept changing. Try again.")

    @classmethod
    def _take(cls, run_dir: Path, path: Path, descriptor: int, say: Callable[[str], None]) -> RunLock | None:
        """The lock through ``descriptor`` (open on ``path``); ``None`` when ``path`` is no longer that file."""
        locked = _try_flock(descriptor)
        if locked is False:
            raise RunLockedError(_busy_message(run_dir, path, _read_holder(path)))
        if not _same_file(descriptor, path):
            return None
        me, previous = this_process(), _read_holder(path)
        if previous is not None:
            if previous.host != me.host:
                raise RunLockedError(_busy_message(run_dir, path, previous))
            if locked is None and previous.pid != me.pid and not process_gone(previous.pid):
                raise RunLockedError(_busy_message(run_dir, path, previous))
            say(f"took over the lock of {run_dir} from {previous.describe()}: that process is gone")
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, (json.dumps(asdict(me)) + "\n").encode(), 0)
        os.fsync(descriptor)
        return cls(path, descriptor, me)

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._descriptor is not None

    def release(self) -> None:
        """Remove the lock file and let go of it; a second call does nothing."""
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is None:
            return
        try:
            if _same_file(descriptor, self.path):
                self.path.unlink()
        except OSError:
            pass  # a lock file that cannot be removed is stale once the lock is let go
        finally:
            os.close(descriptor)


def _try_flock(descriptor: int) -> bool | None:
    """True: locked; False: another open file holds it; None: this file system has no ``flock``."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as error:
        if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return None
        raise
    return True


def _same_file(descriptor: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``descriptor``."""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _read_holder(path: Path) -> LockHolder | None:
    """The holder ``path`` records; ``None`` when it is empty or unreadable (a holder still starting)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return LockHolder(int(data["pid"]), str(data["host"]), str(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _busy_message(run_dir: Path, path: Path, holder: LockHolder | None) -> str:
    """Why ``run_dir`` is refused, naming its holder and what to do."""
    who = holder.describe() if holder is not None else "another process (still starting)"
    message = (
        f"{run_dir} is in use by another run: {who} (lock file {path}). "
        "Wait for it to end, or choose another --output.run-name"
    )
    if holder is not None and holder.host != socket.gethostname():
        return f"{message}; if {holder.host} is gone and that run with it, remove {path}."
    return f"{message}."
