"""``--resume``: which run directory under ``output.runs_dir`` a run continues.

``--resume NAME`` takes the run directory named ``NAME``, else the one whose ``recipe.json`` was run as
``--output.run-name NAME``; none or several is an error listing the runs there. ``--resume`` alone takes
``--output.run-name``, else the newest run of the recipe (by its ``recipe.json``, or a ``<recipe>-<time>`` folder
without one) holding a complete checkpoint. The command then continues the run as its ``recipe.json`` says
(``recorded_recipe_file``, ``resume_base``, ``with_recorded_run``): that recipe is the base the flags given apply
to, not the defaults of the recipe it was named after.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

from titanpod.checkpoint import complete_checkpoints
from titanpod.checkpoint.locations import local_path
from titanpod.recipes.recipe import NamedRun
from titanpod.runs.recipe_history import RECIPE_FILE

ResumableRun = TypeVar("ResumableRun", bound=NamedRun)
"""A recipe kind with ``name``, ``output`` and ``checkpoint`` (pretraining, SFT)."""

LISTED = 12
"""How many run directories an error lists before ``...``."""


def recorded_recipe(run: Path) -> dict[str, Any]:
    """The recipe a run directory recorded (its ``recipe.json``); ``{}`` when it has none that can be read."""
    try:
        data = json.loads((run / RECIPE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_folders(runs_dir: Path) -> list[Path]:
    """The folders in ``runs_dir`` (none when it does not exist), by name; hidden ones left out."""
    if not runs_dir.is_dir():
        return []
    return sorted(path for path in runs_dir.iterdir() if path.is_dir() and not path.name.startswith("."))


def newest_checkpoint_time(run: Path) -> float | None:
    """When the newest complete checkpoint in ``<run>/checkpoints`` was written; ``None`` without one."""
    found = complete_checkpoints(run / "checkpoints")
    newest = local_path(found[-1][1]) if found else None
    return newest.stat().st_mtime if newest is not None else None


def is_run_of(run: Path, recipe_name: str) -> bool:
    """Whether ``run`` is a run of the recipe ``recipe_name``: its ``recipe.json`` says so, or, without one, its
    folder is named ``<recipe>-<time>``."""
    recorded = recorded_recipe(run)
    return recorded.get("name") == recipe_name if recorded else run.name.startswith(f"{recipe_name}-")


def latest_resumable_run(recipe: NamedRun) -> str | None:
    """Name of the newest run directory of ``recipe`` under ``output.runs_dir`` holding a complete checkpoint (named
    or ``<recipe>-<time>``; the newest checkpoint decides); ``None`` when there is none."""
    found = []
    for run in run_folders(Path(recipe.output.runs_dir)):
        written = newest_checkpoint_time(run) if is_run_of(run, recipe.name) else None
        if written is not None:
            found.append((written, run.name))
    return max(found)[1] if found else None


def find_run(runs_dir: Path, name: str) -> str:
    """The run directory ``--resume NAME`` means: ``runs_dir/NAME``, else the one run there recorded as
    ``--output.run-name NAME``. ``ValueError`` lists the runs when none or several match."""
    if (runs_dir / name).is_dir():
        return name
    runs = run_folders(runs_dir)
    matches = [run.name for run in runs if (recorded_recipe(run).get("output") or {}).get("run_name") == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(
            f"--resume {name}: several runs under {runs_dir} were run as --output.run-name {name} "
            f"({', '.join(matches)}): give the folder of the one to continue, --resume {matches[-1]}."
        )
    names = [run.name for run in runs]
    listed = ", ".join(names[:LISTED]) + (", ..." if len(names) > LISTED else "") if names else "none"
    raise ValueError(
        f"--resume {name}: no run under {runs_dir} is named {name} (runs there: {listed}). Give one of them, "
        "--output.runs-dir where the run is, or start a new run without --resume."
    )


def with_resume(recipe: ResumableRun, name: str | None = None) -> ResumableRun:
    """``--resume [NAME]``: the recipe set to continue a run. With ``name``, the run ``find_run`` finds under
    ``--output.runs-dir``; without, ``--output.run-name``, else the newest run of this recipe that has a complete
    checkpoint (``latest_resumable_run``). With ``--checkpoint.dir`` the checkpoints are found there, so no earlier
    run directory is needed (without one, the resumed run writes its metrics to a new run directory).

    ``ValueError`` when there is no such run, saying how to name one or start afresh; with a ``name`` that is not
    ``--output.run-name``; and with ``--output.start-over``, which asks for the opposite.
    """
    output = recipe.output
    if output.start_over:
        raise ValueError(
            "--resume continues a run and --output.start-over moves its files aside to start a new one: "
            "give one of them."
        )
    if name:
        if output.run_name and output.run_name != name:
            raise ValueError(
                f"--resume {name} and --output.run-name {output.run_name} name two runs: give one of them."
            )
        run_name: str | None = find_run(Path(output.runs_dir), name)
    else:
        run_name = output.run_name or latest_resumable_run(recipe)
    if run_name is None and not recipe.checkpoint.dir:
        raise ValueError(
            f"--resume: no run of recipe {recipe.name} under {output.runs_dir} has a complete checkpoint; "
            "give the run's name (--resume NAME), or start a new one without --resume."
        )
    return dataclasses.replace(
        recipe,
        output=dataclasses.replace(output, run_name=run_name),
        checkpoint=dataclasses.replace(recipe.checkpoint, resume="auto"),
    )


def recorded_recipe_file(recipe: NamedRun) -> Path | None:
    """The ``recipe.json`` of the run directory ``recipe`` continues (``<runs_dir>/<run_name>``); ``None`` when it
    names no run directory or the directory holds none."""
    if not recipe.output.run_name:
        return None
    path = Path(recipe.output.runs_dir) / recipe.output.run_name / RECIPE_FILE
    return path if path.is_file() else None


def resume_base(recorded: ResumableRun) -> ResumableRun:
    """A run's own recipe (its ``recipe.json``) as the base a command continuing it applies its flags to, without the
    settings that were for one part of the run: ``checkpoint.allow_changes`` (an allowance is for the run that makes
    the change) and ``train.stop_at_step`` (where that part stopped; kept, the run would stop there again)."""
    base = dataclasses.replace(recorded, checkpoint=dataclasses.replace(recorded.checkpoint, allow_changes=()))
    train = getattr(recorded, "train", None)
    if getattr(train, "stop_at_step", 0):
        base = dataclasses.replace(base, train=dataclasses.replace(train, stop_at_step=0))
    return base


def with_recorded_run(recorded: ResumableRun, resumed: NamedRun) -> ResumableRun:
    """``recorded`` (a run's own recipe, with the command line's flags applied) set to continue that run as
    ``with_resume`` found it (``resumed``): its folder under the runs directory where it was found (a folder
    renamed or moved since keeps its place), from its newest checkpoint."""
    output = dataclasses.replace(recorded.output, runs_dir=resumed.output.runs_dir, run_name=resumed.output.run_name)
    return dataclasses.replace(
        recorded, output=output, checkpoint=dataclasses.replace(recorded.checkpoint, resume="auto")
    )
