"""A full disk during a save, reported as where it happened and how much the save needed (or, where bytes are
free, as a file system out of inodes); and the failures a save's write can hide inside DCP's wrapping
(``os_error_cause``), a folder no longer writable among them."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException


class DiskFullError(OSError):
    """A save ran out of space: names the path, the bytes it needed and the bytes free there."""


UNWRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
"""The ``errno`` of a write refused because the folder (or its file system) cannot be written."""


def disk_full_cause(error: BaseException) -> OSError | None:
    """The ``ENOSPC`` ``OSError`` behind ``error`` (itself, a cause or context, or one rank's failure inside
    a DCP ``CheckpointException``); ``None`` when the disk is not what failed."""
    return os_error_cause(error, frozenset({errno.ENOSPC}))


def unwritable_cause(error: BaseException) -> OSError | None:
    """The ``OSError`` behind ``error`` that says a folder cannot be written (``UNWRITABLE``: permission denied,
    a read-only file system); ``None`` when that is not what failed."""
    return os_error_cause(error, UNWRITABLE)


def os_error_cause(error: BaseException, codes: frozenset[int]) -> OSError | None:
    """The ``OSError`` with an ``errno`` in ``codes`` behind ``error``: itself, a cause or context, or one rank's
    failure inside a DCP ``CheckpointException``; ``None`` when there is none."""
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, OSError) and item.errno in codes:
            return item
        if isinstance(item, CheckpointException):
            pending.extend(failure for failure, _ in item.failures.values())
        pending.extend(linked for linked in (item.__cause__, item.__context__) if linked is not None)
    return None


def free_bytes(path: Path) -> int | None:
    """Bytes free on the file system that holds ``path`` (its nearest existing folder); ``None`` if unknown."""
    for folder in (Path(path), *Path(path).parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


INODE_MARGIN = 1000
"""Free files (inodes) below which a write that found no space is put down to the file system's files."""


def free_files(path: Path) -> tuple[int, int] | None:
    """Files (inodes) free to this user, and in all, on the file system that holds ``path`` (its nearest existing
    folder); ``None`` where that cannot be read or the file system does not count files (it reports none)."""
    for folder in (Path(path), *Path(path).parents):
        if folder.exists():
            try:
                found = os.statvfs(folder)
            except OSError:
                return None
            return None if found.f_files == 0 else (found.f_favail, found.f_files)
    return None


def disk_full_error(path: Path | str, needed_bytes: int, what: str = "the save") -> DiskFullError:
    """The error to raise when writing ``needed_bytes`` into ``path`` found no space left; call it before what
    the write took is removed. Where the bytes needed are free but the file system's files (inodes) are all but
    used up, the error says so: that is what ``ENOSPC`` meant."""
    local = "://" not in str(path)
    free = free_bytes(Path(path)) if local else None
    files = free_files(Path(path)) if local else None
    if files is not None and files[0] < INODE_MARGIN and (free is None or free >= needed_bytes):
        left = "" if free is None else f", while {_size(free)} is free"
        return DiskFullError(
            f"The file system of {path} is out of inodes (files), not space: {files[0]:,} of its {files[1]:,} "
            f"files are free{left}, and {what} needs new files. The unfinished files were removed. Delete files "
            "you no longer need there (many small files count most: old runs, caches, older checkpoints: "
            "checkpoint.keep_last), or write to another file system (--output.runs-dir, --checkpoint.dir, or "
            "another output folder)."
        )
    there = "" if free is None else f", {_size(free)} free there"
    return DiskFullError(
        f"No space left on the device while writing {path}: {what} needs about {_size(needed_bytes)}{there}. "
        "The unfinished files were removed. Free some space (old runs, older checkpoints: checkpoint.keep_last) "
        "or write somewhere else (--output.runs-dir, --checkpoint.dir, or another output folder)."
    )


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a nested dict/list ``state`` (a ``DTensor`` counts its local shard)."""
    if isinstance(state, dict):
        return sum(state_bytes(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(value) for value in state)
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return local.numel() * local.element_size()
    return 0


@contextmanager
def disk_full_named(path: Any, needed_bytes: int, remove_partial: Callable[[], None], what: str) -> Iterator[None]:
    """Run the block; when it fails for a full disk, call ``remove_partial`` (drop what was half written) and
    raise a ``DiskFullError`` naming ``path`` and ``needed_bytes`` instead. Other errors pass unchanged."""
    try:
        yield
    except BaseException as error:
        if disk_full_cause(error) is None:
            raise
        full = disk_full_error(path, needed_bytes, what)  # before the cleanup frees what the write took
        remove_partial()
        raise full from error


def _size(count: int) -> str:
    """``1,234,567,890 bytes (1.15 GiB)``."""
    return f"{count:,} bytes ({count / 2**30:.2f} GiB)"
