"""The entry the three commands share (``titanpod-pretrain``, ``titanpod-posttrain``, ``titanpod-diffusion``).

Each app names its distribution and the module that holds its command (``AppCommands``); ``run_app`` does the
rest the same way for all three:

- ``--version`` answers before anything else is imported;
- the command line is parsed by the app's module, imported only then (``--help`` is answered there, by tyro);
  a recipe or a value refused is one line on stderr and exit status 2;
- what the command does instead of training (print, plan, compile, rehearse, sample) is the app's;
- a run starts with a short header (the recipe's name, and where its every setting is: ``--print-recipe``
  and the run's ``recipe.json``); the runner adds the model, lane, layout, data and run directory;
- a run stopped by a signal ends with the command that resumes it, when it has a checkpoint to resume from.

Nothing here imports torch: the app's module does, once it is needed.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape

from titanpod.recipes.errors import print_error

PARSE_ERRORS = (KeyError, ValueError)
"""What a refused recipe, file or value raises while parsing or planning: exit status 2."""

RUN_ERRORS = (KeyError, ValueError, RuntimeError, OSError, ImportError)
"""What a run that could not go on raises (NotImplementedError is a RuntimeError; an ImportError names a missing
optional dependency): exit status 1."""


@dataclass(frozen=True)
class Finished:
    """What an app's training reports back to the entry, once it has printed its summary."""

    code: int
    """The process exit status the run deserves (``titanpod.runs.process_exit.run_exit_code``)."""
    run_dir: Path | None
    """The run directory (where ``recipe.json`` is)."""
    interrupted: bool = False
    """Whether a signal (Ctrl-C, SIGTERM) stopped the run before its last step."""
    is_main: bool = True
    """Whether this process speaks (rank 0 under torchrun)."""
    processes: int = 1
    """The job's processes: above 1 the process leaves at once once its run is written (``leave``)."""


class AppCommands(Protocol):
    """What an app's command module provides (a module satisfies it with three functions)."""

    def parse(self, argv: list[str]) -> Any | None:
        """The command ``argv`` asks for (with a ``recipe`` attribute), or ``None`` when parsing answered it
        (``--list-recipes``). A refused recipe or value raises ``KeyError`` or ``ValueError``."""
        ...

    def act(self, command: Any, console: Console) -> int | None:
        """Do what the command asks instead of training and give the exit status; ``None`` to train."""
        ...

    def train(self, command: Any, console: Console) -> Finished:
        """Train the command's recipe and print its summary (on the main process)."""
        ...


@dataclass(frozen=True)
class App:
    """One command: its name, its distribution, where its commands live and how a stopped run resumes."""

    prog: str
    """The command's name, e.g. ``titanpod-pretrain``."""
    distribution: str
    """The distribution whose version ``--version`` prints."""
    commands: str
    """The module that provides ``AppCommands``, imported once the command line is more than ``--version``."""
    resume_flag: str = "--resume"
    """The flag that continues the run named after it (``--output.run-name`` where there is no ``--resume``)."""


def version_line(app: App) -> str:
    """``titanpod-pretrain 0.1.0``: the command and its distribution's version."""
    try:
        version = metadata.version(app.distribution)
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    return f"{app.prog} {version}"


def header_line(app: App, recipe_name: str) -> str:
    """The line a run starts with: the recipe, and where its every setting is written."""
    return (
        f"{app.prog}: recipe [bold]{escape(recipe_name)}[/] (every setting: --print-recipe, and recipe.json in the "
        "run directory)"
    )


def resume_command(app: App, run_dir: Path) -> str:
    """The command that continues the run in ``run_dir`` from its newest checkpoint, with the recipe it ran."""
    recipe_file = shlex.quote(str(run_dir / "recipe.json"))
    return f"{app.prog} --recipe {recipe_file} {app.resume_flag} {shlex.quote(run_dir.name)}"


def resumable(recipe: Any, run_dir: Path | None) -> bool:
    """Whether the run in ``run_dir`` has a complete checkpoint to resume from (in ``--checkpoint.dir`` when the
    recipe sets one)."""
    if run_dir is None:
        return False
    from titanpod.checkpoint import complete_checkpoints

    return bool(complete_checkpoints(recipe.checkpoint.dir or run_dir / "checkpoints"))


def run_app(app: App, argv: Sequence[str] | None = None) -> int:
    """Run ``app`` on ``argv`` (``sys.argv[1:]`` when ``None``); returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args:
        print(version_line(app))
        return 0
    commands: AppCommands = importlib.import_module(app.commands)  # type: ignore[assignment]
    console = Console()
    try:
        command = commands.parse(args)
        if command is None:
            return 0
        code = commands.act(command, console)
    except PARSE_ERRORS as error:
        print_error(error)
        return 2
    if code is not None:
        return code
    from titanpod.device import process_info  # torch: the run is about to need it anyway

    if process_info().is_main:  # under torchrun rank 0 alone speaks
        console.print(header_line(app, command.recipe.name), soft_wrap=True, highlight=False)
    try:
        finished = commands.train(command, console)
    except RUN_ERRORS as error:
        print_error(error)
        return 1
    if finished.interrupted and finished.is_main and resumable(command.recipe, finished.run_dir):
        console.print(f"to resume, run: {escape(resume_command(app, finished.run_dir))}", soft_wrap=True)
    if finished.processes > 1:
        leave(finished.code)
    return finished.code


def leave(code: int) -> None:
    """End this process with ``code`` now, without the interpreter's teardown: a torchrun rank whose run is
    written (``titanpod.runs.process_exit.exit_rank`` says why)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
