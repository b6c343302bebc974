"""A run's Weights & Biases run, set up the way W&B's users expect, and what happens when it cannot start.

Each setting comes from the recipe's field when that is set (a flag, a recipe file), else from W&B's own
environment variable, else from titanpod's default:

============  ===============================  ======================================  ===========================
setting       recipe field                     environment                             default
============  ===============================  ======================================  ===========================
project       ``output.wandb`` (not ``auto``)  ``WANDB_PROJECT``                       ``titanpod``
entity        ``output.wandb_entity``          ``WANDB_ENTITY``                        your W&B default
mode          ``output.wandb_mode``            ``WANDB_MODE`` (``disabled``: no W&B)   ``online``
run name      -                                ``WANDB_NAME``                          the run directory's name
files         -                                ``WANDB_DIR``                           the run directory
run id        -                                ``WANDB_RUN_ID``                        ``<run>/wandb-run-id``, else new
============  ===============================  ======================================  ===========================

The id of the W&B run is kept in the run directory (``wandb-run-id``), so a resumed run continues the same
W&B run (``resume="allow"``, or what ``WANDB_RESUME`` says). An offline run resumed gets a second
``offline-run-*`` folder with the same id; ``wandb sync`` both, oldest first.

When the W&B run cannot start (no ``wandb login``, the server out of reach) the run says why and what to do in
one line and trains without W&B; with ``output.wandb_required`` it stops before any work instead.
"""

from __future__ import annotations

import os
import secrets
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.markup import escape

from titanpod.graph.tracking import TrackerStartError, WandbWriter
from titanpod.recipes.recipe import OutputConfig

RUN_ID_FILE = "wandb-run-id"
"""The file in the run directory that keeps the W&B run's id, for a resumed run to continue it."""
AUTO_PROJECT = "auto"
"""The ``output.wandb`` value that takes the project from ``WANDB_PROJECT``."""
DEFAULT_PROJECT = "titanpod"
"""The W&B project of ``output.wandb auto`` when ``WANDB_PROJECT`` is not set."""
MODES: Mapping[str, Literal["online", "offline", "disabled"]] = {
    "online": "online",
    "run": "online",
    "offline": "offline",
    "dryrun": "offline",
    "disabled": "disabled",
}
"""``WANDB_MODE`` values and the mode each means (``run`` and ``dryrun`` are W&B's older names)."""
LOGIN_FIX = (
    "run `wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline to keep the run for a later `wandb sync`"
)
"""What to do when an online W&B run cannot start."""
REQUIRED_FLAG = "--output.wandb-required"
"""The flag that makes a W&B run that cannot start stop the training run."""


class WandbStartError(RuntimeError):
    """W&B could not start and ``output.wandb_required`` is on: the run stops before any work."""


@dataclass(frozen=True)
class WandbChoice:
    """Everything ``wandb.init`` is given, decided from the recipe, the environment and the run directory."""

    project: str
    """The W&B project."""
    entity: str | None
    """The W&B entity (user or team); ``None``: the logged-in user's default."""
    mode: Literal["online", "offline"]
    """Online (sent as the run goes) or offline (kept for ``wandb sync``)."""
    name: str
    """The W&B run's display name."""
    folder: Path
    """Where W&B keeps its files (a ``wandb/`` folder is made in it)."""
    run_id: str
    """The W&B run's id: the same id continues the same W&B run."""
    resume: str
    """``wandb.init``'s ``resume``: ``allow`` (continue the run with this id when there is one) unless
    ``WANDB_RESUME`` says otherwise."""
    id_source: Literal["WANDB_RUN_ID", "stored", "new"]
    """Where ``run_id`` came from: the environment, the run directory's ``wandb-run-id``, or made now."""


def wandb_mode(
    field: Literal["online", "offline"] | None, environ: Mapping[str, str]
) -> Literal["online", "offline", "disabled"]:
    """The mode a run uses: ``field`` when set, else ``WANDB_MODE`` (``ValueError`` naming an unknown value),
    else ``online``."""
    if field is not None:
        return field
    value = environ.get("WANDB_MODE", "").strip().lower()
    if not value:
        return "online"
    if value not in MODES:
        raise ValueError(
            f"WANDB_MODE={environ['WANDB_MODE']!r} is not a W&B mode: set it to one of {', '.join(MODES)}, "
            "or give --output.wandb-mode online|offline, which wins over it."
        )
    return MODES[value]


def choose_wandb(
    output: OutputConfig, run_dir: Path, environ: Mapping[str, str], stored_id: str | None
) -> WandbChoice | None:
    """The W&B run a run with ``output`` in ``run_dir`` starts or continues (``stored_id``: the id kept in the
    run directory, if any); ``None`` when W&B is off (``output.wandb`` unset, or ``WANDB_MODE=disabled`` with
    ``output.wandb_mode`` unset). A recipe field that is set wins over the environment, which wins over the
    default (see the module's table)."""
    if not output.wandb:
        return None
    mode = wandb_mode(output.wandb_mode, environ)
    if mode == "disabled":
        return None
    project = output.wandb
    if project == AUTO_PROJECT:
        project = environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
    id_source: Literal["WANDB_RUN_ID", "stored", "new"]
    if environ.get("WANDB_RUN_ID"):
        run_id, id_source = environ["WANDB_RUN_ID"], "WANDB_RUN_ID"
    elif stored_id:
        run_id, id_source = stored_id, "stored"
    else:
        run_id, id_source = new_run_id(), "new"
    return WandbChoice(
        project=project,
        entity=output.wandb_entity or environ.get("WANDB_ENTITY") or None,
        mode=mode,
        name=environ.get("WANDB_NAME") or run_dir.name,
        folder=Path(environ["WANDB_DIR"]) if environ.get("WANDB_DIR") else run_dir,
        run_id=run_id,
        resume=environ.get("WANDB_RESUME") or "allow",
        id_source=id_source,
    )


def new_run_id() -> str:
    """A new W&B run id: 8 random lowercase letters and digits, as W&B makes them."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def read_run_id(run_dir: Path) -> str | None:
    """The W&B run id kept in ``run_dir`` (``None`` when none is, or the file is empty)."""
    path = Path(run_dir) / RUN_ID_FILE
    if not path.is_file():
        return None
    return path.read_text(encoding="utf-8").strip() or None


def write_run_id(run_dir: Path, run_id: str) -> None:
    """Keep ``run_id`` in ``run_dir`` (written beside, then renamed into place: never half-written)."""
    path = Path(run_dir) / RUN_ID_FILE
    staging = path.with_name(f".{RUN_ID_FILE}.{os.getpid()}")
    staging.write_text(run_id + "\n", encoding="utf-8")
    staging.replace(path)


def open_wandb(
    output: OutputConfig,
    run_dir: Path,
    config: dict[str, Any],
    say: Callable[[str], None],
    environ: Mapping[str, str] | None = None,
) -> WandbWriter | None:
    """Rank 0: start (or continue) the run's W&B run and keep its id in ``run_dir``; ``None`` when W&B is off or
    cannot start. A W&B run that cannot start is said in one line naming the fix, and the run goes on without
    W&B; with ``output.wandb_required`` it raises ``WandbStartError`` instead, as it does when W&B is not installed."""
    environ = os.environ if environ is None else environ
    stored = read_run_id(run_dir)
    choice = choose_wandb(output, run_dir, environ, stored)
    if choice is None:
        if output.wandb:
            say("W&B is off: WANDB_MODE=disabled (--output.wandb-mode online|offline turns it on)")
        return None
    if choice.id_source == "WANDB_RUN_ID" and stored and stored != choice.run_id:
        say(f"W&B: WANDB_RUN_ID={choice.run_id} is used instead of this run's W&B run {stored}")
    try:
        writer = WandbWriter(
            choice.project,
            choice.mode,
            choice.folder,
            choice.name,
            config,
            entity=choice.entity,
            run_id=choice.run_id,
            resume=choice.resume,
        )
    except ImportError as error:  # asked for by name: installing it is the fix, never a silent run without it
        raise WandbStartError(str(error)) from error
    except TrackerStartError as error:
        fix = LOGIN_FIX if choice.mode == "online" else "check the folder W&B writes to (WANDB_DIR)"
        message = f"W&B could not start the {choice.mode} run {choice.run_id} in {choice.project} ({error}): {fix}"
        shown = escape(message)
        if output.wandb_required:
            raise WandbStartError(f"{message}. Stopped before any work ({REQUIRED_FLAG} is on).") from error
        say(f"[yellow]{shown}.[/] Training goes on without W&B.")
        return None
    if writer.run_id != stored:
        write_run_id(run_dir, writer.run_id)
    continued = "continues" if stored == writer.run_id else "starts"
    say(f"W&B: {continued} {choice.mode} run {writer.run_id} in {choice.project} ({writer.run_dir})")
    return writer
