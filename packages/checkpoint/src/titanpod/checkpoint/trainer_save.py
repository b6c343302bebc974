"""Writing a trainer-state checkpoint's folder: made ready for the step's files, then made complete
(``trainer.json``, the commit marker last, locally the rename), and old checkpoints pruned."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from titanpod.checkpoint.disk_space import disk_full_named, unwritable_cause
from titanpod.checkpoint.errors import CheckpointError, CheckpointFolderUnwritableError
from titanpod.checkpoint.locations import (
    Location,
    exists,
    is_link,
    is_url,
    join,
    local_path,
    make_folder,
    remove_tree,
    write_bytes,
)
from titanpod.checkpoint.step_folders import (
    COMMIT_MARKER,
    TRAINER_FILE,
    complete_checkpoints,
    move_aside,
    needs_marker,
    set_aside,
    step_folder_name,
    write_marker,
)


def save_target(folder: Location, step_number: int, is_main: bool, say: Callable[[str], None]) -> Location:
    """The folder a save of ``step_number`` writes into, made empty by rank 0 (every rank calls this): locally a
    staging folder renamed when complete, at a URL (no rename) the step folder itself. A step folder already
    there (left by another run, or without ``trainer.json``) is moved aside, never overwritten."""
    final = join(folder, step_folder_name(step_number))
    target = final if needs_marker(folder) else join(folder, f".{step_folder_name(step_number)}.partial")
    if is_main:
        if exists(final):
            say(set_aside(final))
        if exists(target):
            remove_tree(target, first=COMMIT_MARKER)
        make_folder(target)
    if dist.is_initialized():
        dist.barrier()
    return target


def state_writer(folder: Location) -> dcp.FileSystemWriter:
    """The DCP writer of ``folder``: the local one (fsynced files), or fsspec's for a URL (an object is stored
    when its stream closes; fsspec streams have no file descriptor to fsync)."""
    if is_url(folder):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(str(folder), single_file_per_rank=True, sync_files=False)
    return dcp.FileSystemWriter(folder, single_file_per_rank=True, sync_files=True)


def full_disk_named(target: Location, needed_bytes: int, is_main: bool) -> AbstractContextManager[None]:
    """A full disk while saving into ``target``: its unfinished folder removed (rank 0; earlier checkpoints
    are untouched), then a ``DiskFullError`` naming it and the bytes this process's state needs."""

    def remove_partial() -> None:
        if is_main and exists(target):
            remove_tree(target, first=COMMIT_MARKER)

    return disk_full_named(target, needed_bytes, remove_partial, "this process's trainer state")


@contextmanager
def unwritable_named(folder: Location, target: Location, step_number: int, is_main: bool) -> Iterator[None]:
    """Run the save of ``step_number`` into ``target``; when a write fails because ``folder`` cannot be written
    (``unwritable_cause``), remove the unfinished ``target`` where that can be done (rank 0) and raise a
    ``CheckpointFolderUnwritableError`` naming the folder and what to do. Other errors pass unchanged."""
    try:
        yield
    except (Exception, CheckpointException) as error:  # DCP's own CheckpointException is no Exception
        cause = unwritable_cause(error)
        if cause is None:
            raise
        left = ""
        if is_main and exists(target):
            try:
                remove_tree(target, first=COMMIT_MARKER)
            except (OSError, CheckpointError):
                left = f" Its unfinished folder {target} could not be removed: the next start removes it."
        where = f": {cause.filename}" if cause.filename else ""
        raise CheckpointFolderUnwritableError(
            f"Cannot save the checkpoint of step {step_number}: the checkpoint folder {folder} is not writable "
            f"({cause.strerror}{where}), though it was when the run started. Make it writable again: the same "
            "command then resumes from the newest checkpoint (or copy the checkpoints to a writable folder and give "
            f"it as --checkpoint.dir).{left}"
        ) from error


def commit(
    folder: Location, target: Location, step_number: int, trainer_bytes: bytes, say: Callable[[str], None]
) -> None:
    """Make the save in ``target`` a checkpoint (rank 0, once every rank's files are written): ``trainer.json``,
    then the commit marker (last), then locally the fsync and the rename to its step folder."""
    write_bytes(join(target, TRAINER_FILE), trainer_bytes)
    write_marker(target, step_number, trainer_bytes)
    final = join(folder, step_folder_name(step_number))
    staging = local_path(target) if not is_url(target) else None
    if staging is not None:  # locally the folder appears whole, on disk, by its rename
        _fsync_tree(staging)
        if exists(final):
            remove_tree(final)
        staging.rename(final)
    say(f"saved checkpoint {final}")


def prune(
    folder: Location,
    keep_last: int,
    problem_of: Callable[[Location], str | None],
    say: Callable[[str], None],
    said_links: set[str],
) -> None:
    """Keep the newest ``keep_last`` complete checkpoints that pass their checks (0 keeps all) and delete the older
    ones, each marker first.

    Newest first, each checkpoint to keep is checked (``problem_of``: what is wrong, ``None`` when it passes). One
    that does not pass is not counted and never deleted: it is moved aside to ``<name>.damaged-<UTC time>`` (left in
    place where it cannot be moved), saying so, so a good checkpoint is never deleted while a damaged one is kept,
    and a later ``resume auto`` does not take it. A step folder that is a symbolic link is neither counted nor
    followed to delete: it is left as it is, said once (``said_links`` holds the links said).
    """
    if keep_last == 0:
        return
    kept = 0
    for _, path in reversed(complete_checkpoints(folder)):
        if is_link(path):
            if str(path) not in said_links:
                said_links.add(str(path))
                say(
                    f"checkpoint {path} is a symbolic link: keep_last neither counts it nor deletes through it, and "
                    "leaves it as it is (remove the link itself if it is no longer needed)"
                )
            continue
        if kept < keep_last:
            problem = problem_of(path)
            if problem is None:
                kept += 1
            else:
                say(_set_aside_damaged(path, problem))
            continue
        remove_tree(path, first=COMMIT_MARKER)


def _set_aside_damaged(path: Location, problem: str) -> str:
    """Move the checkpoint ``path``, which fails its checks for ``problem``, out of keep_last's count and of
    resume's way, deleting nothing; returns what to say about it."""
    kept = "it is kept, and keep_last counts only checkpoints that pass their checks"
    try:
        target = move_aside(path, "damaged")
    except OSError as error:
        return f"checkpoint {path} fails its checks ({problem.rstrip('.')}): left it in place ({error}); {kept}"
    return f"checkpoint {path} fails its checks ({problem.rstrip('.')}): moved it aside to {target}; {kept}"


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
