"""One writer per checkpoint folder on an object store (``gs://``, ``memory://``): a lock object.

An object store has no ``flock``: the lock is the object ``<folder>/run.lock`` holding its holder (pid, host,
since, as JSON), written at the start of a run and removed at its end. A lock object of a process of this host
that is gone (a run killed with SIGKILL, a rank 0 that torchrun restarts) is taken over with a line saying so;
any other is refused, naming its holder and how to clear it once that run is gone, since this host cannot see
whether a process elsewhere lives.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict

from titanpod.checkpoint.locations import exists, filesystem, join, read_bytes, write_bytes
from titanpod.runs.peer_loss import process_gone
from titanpod.runs.run_lock import LOCK_FILE, LockHolder, LockRole, RunLockedError, parse_holder, this_process


class StoreLock:
    """The held lock object of one folder on an object store; ``release`` removes it while it is still this one."""

    def __init__(self, path: str, holder: LockHolder) -> None:
        self.path = path
        """The lock object's URL."""
        self.holder = holder
        """This process, as the object records it."""
        self._held = True

    @classmethod
    def acquire(cls, folder: str, say: Callable[[str], None], role: LockRole) -> StoreLock:
        """Take the lock of the store folder ``folder`` as ``role``, taking over one of a gone process of this host
        with a line to ``say``; ``RunLockedError`` naming the holder and the fix for any other."""
        path = str(join(folder, LOCK_FILE))
        me = this_process()
        if exists(path):
            previous = parse_holder(read_bytes(path))
            if previous is None or previous.host != me.host or not process_gone(previous.pid):
                raise RunLockedError(_refusal(folder, path, previous, role))
            say(f"took over the lock of {folder} from {previous.describe()}: that process is gone")
        write_bytes(path, (json.dumps(asdict(me)) + "\n").encode())
        return cls(path, me)

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._held

    def release(self) -> None:
        """Remove the lock object when it still records this process; a second call does nothing."""
        if not self._held:
            return
        self._held = False
        try:
            if exists(self.path) and parse_holder(read_bytes(self.path)) == self.holder:
                fs, key = filesystem(self.path)
                fs.rm_file(key)
        except OSError:
            pass  # a lock object that cannot be removed names a gone process: the next run of this host takes it


def _refusal(folder: str, path: str, holder: LockHolder | None, role: LockRole) -> str:
    """Why the store folder ``folder`` is refused, naming its holder and how to clear a lock left behind."""
    who = holder.describe() if holder is not None else "a holder whose lock object cannot be read"
    message = (
        f"{role.what}{folder} is in use by another run: {who} (lock object {path}). Wait for it to end, or "
        f"{role.fix}; if that run is gone, remove {path}."
    )
    return message[0].upper() + message[1:]
