"""One writer per run directory: a lock file that rank 0 holds for the run's whole life.

``<run>/run.lock`` records who holds it (pid, host, since when, as JSON) and is ``flock``-ed by the holder
as long as it lives; the kernel drops that lock when the process ends, however it ends. A second run of
the same directory is refused, naming the holder. A lock whose process is gone (a run killed with
SIGKILL, or a crashed rank 0 that torchrun restarts) is stale: the next run of this host takes it over
and says so. A lock written on another host is refused as long as its file is there, since this host
cannot see whether that process lives: remove the file once that host is gone. Where the file system
has no ``flock``, a lock of this host counts as held while its pid is alive.

The same lock guards a run's checkpoint folder (``LockRole``: what the folder is called in a refusal and the
flag that chooses another). The lock file is opened without following a symbolic link and must be a plain
file: a link or anything else there is refused, naming it, never written through.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
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
class LockRole:
    """What a locked folder is to a run, as a refusal names it."""

    what: str
    """How a refusal names the folder before its path (``""`` for the run directory)."""
    fix: str
    """The way to another folder (``choose another --output.run-name``)."""


RUN_DIR_ROLE = LockRole("", "choose another --output.run-name")
"""The run directory's lock."""
CHECKPOINT_ROLE = LockRole("the checkpoint folder ", "choose another --checkpoint.dir")
"""A checkpoint folder's lock: one run writes checkpoints into a folder at a time."""


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
    def acquire(cls, run_dir: Path, say: Callable[[str], None], role: LockRole = RUN_DIR_ROLE) -> RunLock:
        """Take the lock of ``run_dir`` (which must exist), taking over a stale one with a line to ``say``.

        ``RunLockedError`` when a live process holds it, a process of another host does, or the lock file is a
        symbolic link or not a plain file.
        """
        path = Path(run_dir) / LOCK_FILE
        for _ in range(10):  # the file may be removed or replaced between its opening and its locking
            descriptor = _open_plain(path)
            try:
                lock = cls._take(run_dir, path, descriptor, say, role)
            except BaseException:
                os.close(descriptor)
                raise
            if lock is not None:
                return lock
            os.close(descriptor)
        raise RunLockedError(f"Could not take the lock {path}: the file kept changing. Try again.")

    @classmethod
    def _take(
        cls, run_dir: Path, path: Path, descriptor: int, say: Callable[[str], None], role: LockRole
    ) -> RunLock | None:
        """The lock through ``descriptor`` (open on ``path``); ``None`` when ``path`` is no longer that file."""
        locked = _try_flock(descriptor)
        if locked is False:
            raise RunLockedError(busy_message(run_dir, path, _read_holder(descriptor), role))
        if not _same_file(descriptor, path):
            return None
        me, previous = this_process(), _read_holder(descriptor)
        if previous is not None:
            if previous.host != me.host:
                raise RunLockedError(busy_message(run_dir, path, previous, role))
            if locked is None and previous.pid != me.pid and not process_gone(previous.pid):
                raise RunLockedError(busy_message(run_dir, path, previous, role))
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


def _open_plain(path: Path) -> int:
    """``path`` opened for reading and writing (created when missing) without following a symbolic link;
    ``RunLockedError`` naming it when it is a link or not a plain file, so nothing is written through it."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise RunLockedError(
            f"{path} is a symbolic link (to {os.readlink(path)}): a run makes its lock file itself and never "
            f"writes through a link. Remove {path} (the link only, not what it points to) and start again."
        ) from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise RunLockedError(f"{path} is not a plain file: a run makes its lock file itself. Remove it, start again.")
    return descriptor


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
        named = path.lstat()
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _read_holder(descriptor: int) -> LockHolder | None:
    """The holder the lock file open as ``descriptor`` records; ``None`` when it is empty or unreadable (a holder
    still starting)."""
    try:
        return parse_holder(os.pread(descriptor, 4096, 0))
    except OSError:
        return None


def parse_holder(text: bytes) -> LockHolder | None:
    """The holder a lock file's bytes record; ``None`` when they are empty or not a holder's JSON."""
    try:
        data = json.loads(text.decode("utf-8"))
        return LockHolder(int(data["pid"]), str(data["host"]), str(data["since"]))
    except (ValueError, KeyError, TypeError):
        return None


def busy_message(folder: Path | str, path: Path | str, holder: LockHolder | None, role: LockRole) -> str:
    """Why ``folder`` (its lock file ``path``) is refused as ``role``, naming its holder and what to do."""
    who = holder.describe() if holder is not None else "another process (still starting)"
    message = (
        f"{role.what}{folder} is in use by another run: {who} (lock file {path}). Wait for it to end, or {role.fix}"
    )
    if role.what:
        message = message[0].upper() + message[1:]
    if holder is not None and holder.host != socket.gethostname():
        return f"{message}; if {holder.host} is gone and that run with it, remove {path}."
    return f"{message}."
