"""Before a run builds anything: whether the checkpoint it would continue can be continued under its recipe.

A run continues the checkpoint ``checkpoint.resume`` names (for ``auto``, the newest complete one in the run's
checkpoint folder). Its ``trainer.json`` is read without hashing the state files (loading does that), and the run
is refused, each time naming what and how to go on, when its recipe changes a field the checkpoint must keep
(``titanpod.checkpoint.recipe_changes``: the model, the attention, the data, the trajectory; unless
``checkpoint.allow_changes`` names it), when ``train.steps`` is fewer than the steps done, or when a data file was
rewritten since the checkpoint was written (``titanpod.data.fingerprint``; unless ``checkpoint.allow_changes``
names ``data.path``). A run whose steps are all done is stopped the same way (``RunFinished``; the command says
so and exits 0), unless it names its checkpoint by path (``checkpoint.resume PATH``: the checkpoint taken into
a run of its own, whose weights it writes) or torchrun restarted it: a restart after the last checkpoint finishes
what the first attempt left, such as the final weights. These checks come before the model, the data or the run
directory is touched, so a refused run leaves every file as it was.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titanpod.checkpoint.errors import CheckpointError, DamagedCheckpointError
from titanpod.checkpoint.locations import Location, as_location
from titanpod.checkpoint.recipe_changes import change_text, check_same_run, is_allowed, is_harmless, recipe_changes
from titanpod.checkpoint.recovery import resume_fix
from titanpod.checkpoint.resume_choice import resume_folder
from titanpod.checkpoint.trainer_file import read_trainer_record
from titanpod.data.fingerprint import fingerprint_changes
from titanpod.models.field_checks import same_maths_fields
from titanpod.recipes.recipe import RunRecipe
from titanpod.runs.run_folder import restarted


class RunFinished(CheckpointError):
    """The run has done every step its recipe asks for: nothing to train, nothing written. Says how to go on."""


DATA_FILES_FIELD = "data.path"
"""The recipe field ``checkpoint.allow_changes`` names to accept data files that changed since the checkpoint."""
ALLOW = "checkpoint.allow_changes"
"""The field that lets changes through: not itself shown as one."""


@dataclass(frozen=True)
class Continuation:
    """The checkpoint a run continues, and what the run changes of the recipe and data it was written with."""

    run: str
    """The run, as a command names it (``--resume NAME``), or its checkpoint folder when it has no name."""
    folder: Location
    """The checkpoint folder."""
    step: int
    """Steps done."""
    changes: tuple[str, ...]
    """Each harmless field this run changes, ``name: old -> new`` (fields ``checkpoint.allow_changes`` lets through
    are said by the load)."""
    data_changes: tuple[str, ...] = ()
    """Each data file changed since the checkpoint, which ``--checkpoint.allow-changes data.path`` accepted."""

    def lines(self) -> list[str]:
        """What the run says of the changes as it starts (nothing when it changes nothing)."""
        said = [f"resuming run {self.run} with settings changed: {'; '.join(self.changes)}"] if self.changes else []
        if self.data_changes:
            said.append(
                f"resuming run {self.run} on changed data files (allowed by --checkpoint.allow-changes "
                f"{DATA_FILES_FIELD}): {'; '.join(self.data_changes)}"
            )
        return said


def _quiet(line: str) -> None:
    """Say nothing: the session names the folders resume skips."""


def checkpoint_to_continue(recipe: RunRecipe) -> Location | None:
    """The checkpoint folder the run of ``recipe`` would continue; ``None`` when it starts fresh (``resume never``,
    no checkpoint yet, or a new run directory). ``CheckpointError`` for a ``checkpoint.resume`` path that is no
    complete checkpoint."""
    config, output = recipe.checkpoint, recipe.output
    if config.resume not in ("auto", "never"):
        return resume_folder(as_location(config.resume), config.resume, _quiet)  # a checkpoint path, checked
    if config.resume == "never":
        return None
    if config.dir:
        return resume_folder(as_location(config.dir), "auto", _quiet)
    if not output.run_name:
        return None  # a new run directory named by its start time: nothing in it yet
    return resume_folder(Path(output.runs_dir) / output.run_name / "checkpoints", "auto", _quiet)


def check_continuation(
    recipe: RunRecipe, data_files: Callable[[], Mapping[str, Any]] | None = None
) -> Continuation | None:
    """Refuse, before anything is built or written, a run that cannot continue the checkpoint it would resume
    (``CheckpointError`` naming each reason and the fix) and one with no step left to train (``RunFinished``);
    ``None`` when the run starts fresh.

    ``data_files()`` gives the fingerprint of the run's data files as they are now, compared with the one the
    checkpoint recorded (a checkpoint from before fingerprints is not compared).
    """
    folder = checkpoint_to_continue(recipe)
    if folder is None:
        return None
    try:
        trainer = read_trainer_record(folder)
    except DamagedCheckpointError as error:  # named with the flags that resume from the newest good one
        rerun = f"--output.run-name {shlex.quote(recipe.output.run_name)}" if recipe.output.run_name else ""
        raise DamagedCheckpointError(error.problem, resume_fix(folder, rerun)) from error
    saved, step, allowed = trainer["recipe"], trainer["step"], recipe.checkpoint.allow_changes
    current, same_maths = recipe.to_dict(), same_maths_fields(type(recipe))
    check_same_run(saved, current, folder, allowed, same_maths)
    run = recipe.output.run_name or str(folder)
    steps = recipe.train.steps
    if steps < step:
        raise CheckpointError(
            f"Run {run} has done {step} steps (checkpoint {folder}), and --train.steps {steps} is fewer: a run is "
            f"never cut back below what it has trained. To continue it, give a larger total: --train.steps N, with N "
            f"above {step}; to train {steps} steps, start a new run (--output.run-name NEW)."
        )
    recorded = trainer.get("data_files")
    data_changes = fingerprint_changes(recorded, data_files()) if recorded is not None and data_files else []
    if data_changes and not is_allowed(DATA_FILES_FIELD, allowed):
        raise CheckpointError(
            f"The data files of run {run} are not those its checkpoint {folder} was trained on: "
            f"{'; '.join(data_changes)}. Resuming would read on from the old position in other data. Restore the "
            f"files, start a new run (--output.run-name NEW), or accept the change with "
            f"--checkpoint.allow-changes {DATA_FILES_FIELD}."
        )
    if steps == step and recipe.checkpoint.resume == "auto" and not restarted():  # a checkpoint named by path
        # may be taken whole into another run (a new layout, its weights written), with no step left to train
        resume = f"--resume {run} " if recipe.output.run_name else ""
        raise RunFinished(
            f"Run {run} is finished: {step} of {steps} steps done (checkpoint {folder}); nothing was trained or "
            f"written. To train it further, give the new total: {resume}--train.steps N, with N above {step}."
        )
    shown = [
        change for change in recipe_changes(saved, current) if is_harmless(change[0], same_maths) and change[0] != ALLOW
    ]
    return Continuation(run, folder, step, tuple(change_text(*change) for change in shown), tuple(data_changes))
