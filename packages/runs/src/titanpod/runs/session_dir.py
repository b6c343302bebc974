"""A session's run directory: its name, rank 0's claim and lock on it, and what a refused start leaves of it.

Rank 0 holds the directory's lock while the session is open and refuses an earlier run's files unless the run
resumes or starts over (``titanpod.runs.run_folder``). Once ``RunSession.resume`` has accepted the run, rank 0
writes ``recipe.json`` (``titanpod.runs.recipe_history``). Under torchrun rank 0 picks the name and the others
receive it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import torch.distributed as dist

from titanpod.checkpoint.locations import Location
from titanpod.device import process_info
from titanpod.recipes.recipe import NamedRun, RunRecipe
from titanpod.runs.every_rank import raise_on_every_rank
from titanpod.runs.folder_locks import FolderLocks
from titanpod.runs.recipe_history import RECIPE_FILE, record_recipe
from titanpod.runs.run_folder import claim_run_dir


def run_dir_of(recipe: NamedRun) -> Path:
    """The run directory: ``<runs_dir>/<run_name>``, or ``<runs_dir>/<recipe>-<YYYYmmdd-HHMMSS>``.

    Under torchrun every rank must call it: rank 0 picks the name and the others receive it. A job that torchrun
    restarts (``titanpod-launch --max-restarts``) must be named, or each attempt would start a run of its own.
    """
    if not recipe.output.run_name and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
        raise ValueError(
            "This job restarts itself after a failure (--max-restarts), and each restart resumes the run it finds "
            "by name: name the run with --output.run-name NAME (or output.run_name in the recipe)."
        )
    name = recipe.output.run_name or f"{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if dist.is_initialized():
        chosen = [name]
        dist.broadcast_object_list(chosen, src=0)  # a timestamped name could differ by a second
        name = chosen[0]
    return Path(recipe.output.runs_dir) / name


def prepare_run_dir(
    recipe: RunRecipe, run_dir: Path, checkpoints: Location, say: Callable[[str], None]
) -> FolderLocks | None:
    """Rank 0 claims the run directory (and the checkpoint folder) before anything of the run is written.

    It creates the directory, checks it and a local checkpoint folder can be written, takes its lock for the
    run's life, clears what killed writes left, and refuses an earlier run's files unless this run resumes them
    or starts over (``titanpod.runs.run_folder``). A ``recipe.json`` already there (an earlier run of the
    directory) is left as it is: the session replaces it, keeping it in ``recipe-history/``, once ``resume`` has
    accepted the new recipe (``titanpod.runs.recipe_history``).

    Returns the locks on rank 0 (the run directory's and the checkpoint folder's; ``None`` elsewhere). Under
    torchrun every rank must call it: a refusal is raised on every rank.
    """
    lock, problem = None, None
    if process_info().is_main:
        try:
            start_over = recipe.output.start_over
            lock = claim_run_dir(run_dir, checkpoints, resume=recipe.checkpoint.resume, start_over=start_over, say=say)
        except (OSError, ValueError, RuntimeError) as error:
            if lock is not None:
                lock.release()
            problem = error
    raise_on_every_rank(problem)
    return lock


def remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` when it holds nothing (a folder with anything in it stays as it is)."""
    with suppress(OSError):
        folder.rmdir()


class HeldRunDir:
    """A session's hold on its run directory, from the claim until the session ends.

    A start refused before ``accept`` leaves no run directory it made; another run's files are never removed.
    """

    def __init__(
        self, asked: RunRecipe, path: Path, checkpoints: Location, is_main: bool, say: Callable[[str], None]
    ) -> None:
        """Claim ``path`` for the recipe as ``asked`` (``prepare_run_dir``; every rank calls it). A refused claim
        removes the directory when this start made it and it is still empty, and raises."""
        self.path = path
        """The run directory (the same path on every rank)."""
        self.made = is_main and not path.exists()
        """True on rank 0 when this start made the directory."""
        self.accepted = False
        """True once ``accept`` has recorded the run's recipe."""
        self._is_main = is_main
        self._say = say
        try:
            self.lock = prepare_run_dir(asked, path, checkpoints, say)
            """Rank 0's hold on the run directory and the checkpoint folder, given back when the session ends
            (``None`` on other ranks)."""
        except BaseException:
            if self.made:  # made moments ago by this refused start; another run's files are never removed
                remove_if_empty(path)
            raise

    def accept(self, recipe_json: str) -> None:
        """The run is accepted: rank 0 writes ``recipe_json`` as ``recipe.json``, keeping a different earlier one
        in ``recipe-history/``."""
        if self._is_main and (kept := record_recipe(self.path, recipe_json)) is not None:
            self._say(f"{RECIPE_FILE} now holds this run's recipe; the earlier one is kept as {kept}")
        self.accepted = True

    def remove_made(self) -> None:
        """Remove the directory this start made, with what it wrote (nothing when it was there before)."""
        if self.made:
            shutil.rmtree(self.path, ignore_errors=True)

    def remove_if_refused(self) -> None:
        """Remove the directory this start made when the run never was accepted: a refused run leaves nothing."""
        if not self.accepted:
            self.remove_made()

    def let_go(self) -> None:
        """Rank 0: give the run directory's lock back (a second call does nothing)."""
        if self.lock is not None:
            self.lock.release()
