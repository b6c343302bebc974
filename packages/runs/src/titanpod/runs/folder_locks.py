"""The locks of every folder a run writes: its run directory and its checkpoint folder, held together.

Two runs given one ``--checkpoint.dir`` would otherwise resume each other's checkpoints, delete them
(``checkpoint.keep_last``) or move them aside (``--output.start-over``). A checkpoint folder is therefore locked
as the run directory is (``titanpod.runs.run_lock``; on an object store ``titanpod.runs.store_lock``), also when it
is the default ``<run>/checkpoints``, so a run whose ``--checkpoint.dir`` names another run's checkpoints is
refused while that run lives. A checkpoint folder made only to hold the lock is removed again when the lock is
given back and the folder is still empty.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from titanpod.checkpoint.locations import Location, local_path
from titanpod.runs.run_lock import CHECKPOINT_ROLE, RunLock
from titanpod.runs.store_lock import StoreLock


class FolderLocks:
    """The held locks of a run's folders; ``release`` gives them back, the last taken first."""

    def __init__(self, locks: list[RunLock | StoreLock]) -> None:
        self.locks = locks
        """The locks, in the order they were taken (the run directory's first)."""
        self._made: list[tuple[Path, Path]] = []

    @property
    def held(self) -> bool:
        """Whether every lock is still held."""
        return bool(self.locks) and all(lock.held for lock in self.locks)

    @property
    def paths(self) -> list[Path]:
        """The local lock files (a run moving its files aside leaves them where they are)."""
        return [lock.path for lock in self.locks if isinstance(lock, RunLock)]

    def add(self, lock: RunLock | StoreLock, made: Path | None = None) -> None:
        """Hold ``lock`` too; ``made`` is the outermost folder made to hold it: its folders up to ``made`` are
        removed on release while they are empty."""
        self.locks.append(lock)
        if made is not None and isinstance(lock, RunLock):
            self._made.append((lock.path.parent, made))

    def release(self) -> None:
        """Give every lock back (a second call does nothing), and remove the folders made for them that are empty."""
        for lock in reversed(self.locks):
            lock.release()
        for folder, up_to in reversed(self._made):
            _remove_empty(folder, up_to)  # one that holds something (checkpoints) stays
        self._made = []


def lock_checkpoint_folder(
    checkpoints: Location, say: Callable[[str], None]
) -> tuple[RunLock | StoreLock, Path | None]:
    """Take the lock of the checkpoint folder ``checkpoints`` (``RunLockedError`` naming its holder and
    ``--checkpoint.dir``). Returns the lock and the local folder made for it (``None`` when it was there)."""
    local = local_path(checkpoints)
    if local is None:
        return StoreLock.acquire(str(checkpoints), say, CHECKPOINT_ROLE), None
    made = None if local.exists() else _first_missing(local)
    local.mkdir(parents=True, exist_ok=True)
    try:
        return RunLock.acquire(local, say, CHECKPOINT_ROLE), made
    except BaseException:
        if made is not None:
            _remove_empty(local, made)
        raise


def _first_missing(folder: Path) -> Path:
    """The outermost folder of ``folder``'s chain that does not exist yet (what ``mkdir(parents=True)`` makes)."""
    missing = folder
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    return missing


def _remove_empty(folder: Path, up_to: Path) -> None:
    """Remove ``folder`` and the folders above it up to ``up_to`` while they are empty."""
    current = folder
    while True:
        try:
            os.rmdir(current)
        except OSError:
            return
        if current == up_to or current.parent == current:
            return
        current = current.parent
