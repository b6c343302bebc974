"""What a run checks of its directory before anything of it is written: one writer, writable folders, and
no earlier run's files mixed with its own.

Rank 0 creates the run directory, checks a file can be created in it and in the checkpoint folder (when that
is local), and takes the directory's lock and the checkpoint folder's (``titanpod.runs.folder_locks``: one run
writes into a checkpoint folder at a time, also one given to two runs with ``--checkpoint.dir``). Holding
them, it clears what killed writes left (``titanpod.checkpoint.atomic.remove_leftovers``), then looks for an
earlier run: a ``metrics.jsonl`` with lines, a final-weights folder with files (``model/``, ``hf/``,
``transformer/``) or checkpoint step folders. A final-weights folder that is a symbolic link is refused (the
weights replace that folder whole, never through a link), unless the run starts over. A run that resumes
(``checkpoint.resume auto`` finding a complete checkpoint, or a checkpoint path) continues that run. Any other
run is refused, unless told to start over (``output.start_over``): then every file of the directory is moved,
never deleted, into ``previous-<UTC time>/`` inside it (and step folders of a ``checkpoint.dir`` elsewhere into
``previous-<UTC time>/`` there); the lock files stay where they are. A run restarted by torchrun after a crash
(``TORCHELASTIC_RESTART_COUNT`` above 0) continues its own first attempt: it is neither refused nor started
over again.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from titanpod.checkpoint.atomic import remove_leftovers
from titanpod.checkpoint.locations import (
    Location,
    as_location,
    base_name,
    children,
    exists,
    join,
    local_path,
    make_folder,
    move,
)
from titanpod.checkpoint.step_folders import complete_checkpoints, step_folders
from titanpod.recipes.recipe import RunRecipe
from titanpod.runs.folder_locks import FolderLocks, lock_checkpoint_folder
from titanpod.runs.run_lock import LOCK_FILE, RunLock

Recorded = TypeVar("Recorded", bound=RunRecipe)
"""Any recipe kind (pretraining, SFT, GRPO, diffusion)."""

WEIGHT_FOLDERS = ("model", "hf", "transformer")
"""The folders of a run's final weights (pretraining, SFT and GRPO ``model/`` and ``hf/``; diffusion's
``transformer/``)."""
METRICS_LOG = "metrics.jsonl"
"""The run's metrics, one line per report."""
PREVIOUS_PREFIX = "previous-"
"""The start of the folder an earlier run's files are moved into by ``output.start_over``."""
RUN_DIR_FIX = "Choose another with --output.runs-dir or --output.run-name."
"""What to do when the run directory cannot be written."""
START_OVER_FLAG = "--output.start-over"
"""The flag that moves an earlier run's files aside."""


class RunFolderError(ValueError):
    """The run directory holds an earlier run this run would mix with: names it and what to do."""


def as_recorded(recipe: Recorded) -> Recorded:
    """``recipe`` as a run records it (``recipe.json``, checkpoints): ``output.start_over`` off, since it is done
    once, when the run starts, and a later run from the same recipe file must not start over again."""
    if not recipe.output.start_over:
        return recipe
    return dataclasses.replace(recipe, output=dataclasses.replace(recipe.output, start_over=False))


def restarted() -> bool:
    """Whether torchrun restarted this process after its job's first attempt failed (``--max-restarts``)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    except ValueError:
        return False


def claim_run_dir(
    run_dir: Path, checkpoints: Location, *, resume: str, start_over: bool, say: Callable[[str], None]
) -> FolderLocks:
    """Rank 0, before anything of the run is written: check ``run_dir`` and a local ``checkpoints`` folder can be
    written (``OSError`` naming the folder), create ``run_dir``, take its lock and the lock of ``checkpoints``
    (``RunLockedError`` naming the holder), clear what killed writes left, then refuse a linked weights folder
    and an earlier run's files (``RunFolderError``) or, with ``start_over``, move them aside. Returns the held
    locks; on any error nothing is held."""
    check_writable(run_dir, "the run directory", RUN_DIR_FIX)
    local = local_path(checkpoints)
    if local is not None:
        check_writable(local, "the checkpoint folder", "Make it writable, or choose another with --checkpoint.dir.")
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OSError(f"Cannot write the run directory {run_dir}: {error.strerror}. {RUN_DIR_FIX}") from error
    lock = FolderLocks([RunLock.acquire(run_dir, say)])
    try:
        lock.add(*lock_checkpoint_folder(checkpoints, say))
        for line in remove_leftovers(run_dir):
            say(line)
        if restarted():
            return lock
        if start_over:
            check_resume_kept(run_dir, checkpoints, resume)
            for line in move_aside(run_dir, checkpoints, keep=tuple(lock.paths)):
                say(line)
        else:
            check_no_linked_weights(run_dir)
            check_new_run(run_dir, checkpoints, resume)
    except BaseException:
        lock.release()
        raise
    return lock


def check_writable(folder: Path, what: str, fix: str) -> None:
    """``OSError`` naming ``folder`` (called ``what``) and ``fix`` when no file can be created in it, or, while it
    does not exist yet, in the nearest folder above it (where it will be created); nothing stays behind."""
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise OSError(f"Cannot write {what} {folder}: {existing} is a file, not a folder. {fix}")
    where = "" if existing == folder else f" (in {existing}, where it would be created)"
    probe = existing / f".titanpod-write-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        probe.unlink()
    except OSError as error:
        raise OSError(f"Cannot write {what} {folder}: {error.strerror}{where}. {fix}") from error


def check_no_linked_weights(run_dir: Path) -> None:
    """``RunFolderError`` naming a weights folder of ``run_dir`` (``model/``, ``hf/``, ``transformer/``) that is a
    symbolic link, and the fix: the final weights replace that folder whole, and a run never writes or deletes
    through a link it did not make."""
    for name in WEIGHT_FOLDERS:
        folder = Path(run_dir) / name
        if folder.is_symlink():
            raise RunFolderError(
                f"{folder} is a symbolic link (to {os.readlink(folder)}): a run writes its final weights into a "
                f"folder of its own, never through a link. Remove the link (rm {folder}; what it points to is kept) "
                "or choose another --output.run-name. Nothing was trained or written."
            )


def earlier_run(run_dir: Path, checkpoints: Location) -> list[str]:
    """What an earlier run left in ``run_dir`` and ``checkpoints``: a ``metrics.jsonl`` with lines, weight folders
    with files, step folders; ``[]`` when there is none."""
    found = []
    metrics = Path(run_dir) / METRICS_LOG
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(METRICS_LOG)
    for name in WEIGHT_FOLDERS:
        folder = Path(run_dir) / name
        if folder.is_dir() and any(folder.iterdir()):
            found.append(f"{name}/")
    steps = [base_name(path) for path in step_folders(checkpoints)]
    if steps:
        found.append("checkpoints " + ", ".join(steps[:3]) + (", ..." if len(steps) > 3 else ""))
    return found


def check_new_run(run_dir: Path, checkpoints: Location, resume: str) -> None:
    """``RunFolderError`` when a run that does not resume would mix with an earlier run's files in ``run_dir``.

    ``resume auto`` with a complete checkpoint, and a checkpoint path, resume: fine. ``resume never`` where step
    folders are is left to ``Checkpointer.check_fresh_start``, which names them.
    """
    if resume not in ("auto", "never"):
        return
    if resume == "auto" and complete_checkpoints(checkpoints):
        return
    if resume == "never" and step_folders(checkpoints):
        return
    found = earlier_run(run_dir, checkpoints)
    if not found:
        return
    why = "but no complete checkpoint to resume" if resume == "auto" else "and checkpoint.resume is never"
    raise RunFolderError(
        f"{run_dir} already holds an earlier run's files ({'; '.join(found)}) {why}: name a new run "
        f"(--output.run-name ...) or start over ({START_OVER_FLAG}: they are moved into "
        f"{run_dir}/{PREVIOUS_PREFIX}<UTC time>/, nothing is deleted)."
    )


def check_resume_kept(run_dir: Path, checkpoints: Location, resume: str) -> None:
    """``RunFolderError`` when ``start_over`` would move aside the checkpoint ``checkpoint.resume`` names."""
    if resume in ("auto", "never"):
        return
    resumed = local_path(as_location(resume))
    for folder in (Path(run_dir), local_path(checkpoints)):
        if resumed is not None and folder is not None and resumed.resolve().is_relative_to(folder.resolve()):
            raise RunFolderError(
                f"{START_OVER_FLAG} moves the files of {run_dir} aside, and checkpoint.resume {resume} with them: "
                f"resume from a copy outside {folder}, or leave out {START_OVER_FLAG}."
            )


def move_aside(run_dir: Path, checkpoints: Location, keep: tuple[Path, ...] = ()) -> list[str]:
    """``output.start_over``: every entry of ``run_dir`` (but its lock and earlier ``previous-*`` folders) moved into
    ``run_dir/previous-<UTC time>/``, and the step folders of a ``checkpoints`` folder outside it into
    ``<checkpoints>/previous-<UTC time>/``. The files in ``keep`` (the held lock files) stay where they are, with
    the folders that hold them. Returns a line for each move; nothing when there was nothing to move."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    said = []
    kept = {Path(path).absolute() for path in keep}
    entries = [
        path
        for path in sorted(Path(run_dir).iterdir())
        if path.name != LOCK_FILE and not path.name.startswith(PREVIOUS_PREFIX) and path.absolute() not in kept
    ]
    if entries:
        aside = _new_folder(Path(run_dir), f"{PREVIOUS_PREFIX}{stamp}")
        for path in entries:
            _move_keeping(path, aside / path.name, kept)
        said.append(f"started over: moved {', '.join(path.name for path in entries)} of {run_dir} into {aside}")
    local = local_path(checkpoints)
    if local is not None and local.resolve().is_relative_to(Path(run_dir).resolve()):
        return said  # moved with the run directory
    steps = [path for path in children(checkpoints) if base_name(path).lstrip(".").startswith("step-")]
    if steps:
        aside_location = join(checkpoints, f"{PREVIOUS_PREFIX}{stamp}")
        count = 1
        while exists(aside_location):
            aside_location = join(checkpoints, f"{PREVIOUS_PREFIX}{stamp}-{count}")
            count += 1
        make_folder(aside_location)
        for path in steps:
            move(path, join(aside_location, base_name(path)))
        said.append(f"started over: moved {len(steps)} checkpoint folders of {checkpoints} into {aside_location}")
    return said


def _move_keeping(source: Path, target: Path, kept: set[Path]) -> None:
    """Rename ``source`` to ``target``; a folder holding a file of ``kept`` stays, its other entries moved into a
    new ``target`` folder."""
    source_path = source.absolute()
    if source_path in kept:
        return
    if not source.is_symlink() and source.is_dir() and any(path.is_relative_to(source_path) for path in kept):
        target.mkdir()
        for child in sorted(source.iterdir()):
            _move_keeping(child, target / child.name, kept)
        return
    source.rename(target)


def _new_folder(parent: Path, name: str) -> Path:
    """``parent/name`` created, or ``parent/name-1``, ``-2`` ... when taken."""
    folder, count = parent / name, 1
    while folder.exists():
        folder, count = parent / f"{name}-{count}", count + 1
    folder.mkdir()
    return folder
