"""What ``titanpod-posttrain`` does with its command line (``titanpod.posttrain.cli`` is its entry): parse it into
an SFT or GRPO recipe, then print, plan or train it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import tyro
from rich.console import Console
from rich.table import Table

from titanpod.recipes.app import Finished
from titanpod.recipes.command_flags import RecipeCommand, RecipeT, ResumeFlag
from titanpod.recipes.command_line import (
    flag_value,
    listing_line,
    optional_value,
    parse_args,
    recipe_argument,
    with_steps_scaled,
)
from titanpod.recipes.posttrain.fine_tune_length import with_checkpoint_seq_len
from titanpod.recipes.posttrain.grpo_recipe import GRPORecipe
from titanpod.recipes.posttrain.registry import (
    DEFAULT_POSTTRAIN_RECIPE,
    POSTTRAIN_RECIPES,
    get_posttrain_recipe,
)
from titanpod.recipes.posttrain.sft_recipe import SFTRecipe
from titanpod.recipes.recipe_files import is_recipe_file, load_recipe_file


class PosttrainResult(Protocol):
    """What every post-training runner returns."""

    run_dir: Path
    """The run directory."""
    summary: Any
    """The training loop's summary (a ``TrainSummary``; ``None`` for a GRPO run that stopped before its first step)."""

    @property
    def exit_code(self) -> int:
        """The process exit code the run deserves (``titanpod.runs.process_exit.run_exit_code``)."""
        ...

    def summary_rows(self) -> list[tuple[str, str]]:
        """The run's summary as (label, value) rows."""
        ...


RUNNERS: Mapping[str, str] = {"sft": "titanpod.runs.sft:run_sft", "grpo": "titanpod.rl.grpo.run:run_grpo"}
"""The runner of each recipe kind, as ``module:function`` (imported when a run starts)."""


@dataclasses.dataclass(frozen=True)
class DryRunFlags:
    """``--dry-run``: plan a GRPO recipe's memory instead of running it."""

    dry_run: tyro.conf.FlagCreatePairsOff[bool] = False
    """GRPO recipes: print the memory one device needs (the trainer's share, the KL reference, the rollout
    engine's weights in its inference dtype and its KV cache) on --devices devices, and exit without running."""
    devices: int = 1
    """The devices (one process each) --dry-run plans for."""


@dataclasses.dataclass(frozen=True)
class Command(ResumeFlag, DryRunFlags, RecipeCommand[RecipeT]):
    """What the command line asks for: a recipe with its overrides, its kind, and whether to run or print it."""

    @property
    def kind(self) -> str:
        """The recipe's kind, which picks its runner: ``sft`` or ``grpo``."""
        return recipe_kind(self.recipe)


def recipe_kind(recipe: object) -> str:
    """``grpo`` for a ``GRPORecipe``, else ``sft``."""
    return "grpo" if isinstance(recipe, GRPORecipe) else "sft"


def recipe_class(data: Mapping[str, Any]) -> type:
    """The recipe class of a whole post-training recipe file: GRPO recipes have a ``grpo`` section."""
    return GRPORecipe if "grpo" in data else SFTRecipe


def parse_command(argv: list[str]) -> Command[Any] | None:
    """The recipe named by ``--recipe`` with the remaining flags applied; ``None`` after ``--list-recipes``.

    A value tyro refuses raises ``SystemExit(2)`` after saying so on stderr.
    """
    name = recipe_argument(argv, DEFAULT_POSTTRAIN_RECIPE)
    if is_recipe_file(name):
        base = load_recipe_file(Path(name), lambda named: get_posttrain_recipe(named).build(), recipe_class)
    else:
        base = get_posttrain_recipe(name).build()
    base = with_steps_scaled(base, argv)
    if isinstance(base, SFTRecipe):  # a fine-tune from a checkpoint packs rows as long as the checkpoint's
        base = with_checkpoint_seq_len(base, argv, flag_value(argv, "--model.init-from"))
    command = parse_args(
        Command[type(base)],  # type: ignore[misc]
        Command(recipe=base, recipe_name=name),
        optional_value(argv, "--resume"),
        prog="titanpod-posttrain",
        description=(
            f"Post-train with the recipe chosen with --recipe (default {DEFAULT_POSTTRAIN_RECIPE}; see "
            f"--list-recipes), or print it (--print-recipe). Every recipe field below overrides it; the defaults "
            f"shown are those of {name} ({recipe_kind(base)})."
        ),
        recipe_type=type(base),
    )
    if command.list_recipes:
        for recipe_name, entry in POSTTRAIN_RECIPES.items():
            print(listing_line(f"{recipe_name:20s} {entry.kind}", entry.description, 26))
        return None
    if command.resume is None:
        return command
    from titanpod.runs.run_lookup import with_resume

    return dataclasses.replace(command, recipe=with_resume(command.recipe, command.resume))


def print_summary(console: Console, result: PosttrainResult) -> None:
    """The run's summary rows as a table."""
    table = Table(title="titanpod-posttrain summary", show_header=False)
    for label, value in result.summary_rows():
        table.add_row(label, value)
    console.print(table)


parse = parse_command
"""The command ``argv`` asks for (``titanpod.recipes.app.AppCommands``)."""


def act(command: Command[Any], console: Console) -> int | None:
    """``--print-recipe`` and ``--dry-run``: the exit status; ``None`` to train."""
    if command.print_recipe:
        print(command.recipe.to_json(), end="")
        return 0
    if not command.dry_run:
        return None
    if command.kind != "grpo":
        raise ValueError("--dry-run plans GRPO recipes: pick one with --recipe (e.g. grpo_debug).")
    from titanpod.posttrain.dry_run import grpo_dry_run

    try:
        grpo_dry_run(command.recipe, command.devices, console)
    except OSError as error:  # a model folder that cannot be read: bad input, as a refused recipe is
        raise ValueError(str(error)) from error
    return 0


def train(command: Command[Any], console: Console) -> Finished:
    """Run the recipe's kind of post-training; the main process (rank 0 under torchrun) prints the summary."""
    import importlib

    from titanpod.device import process_info

    module, function = RUNNERS[command.kind].split(":")
    runner = getattr(importlib.import_module(module), function)
    info = process_info()
    speaking = console if info.is_main else None
    result: PosttrainResult = runner(command.recipe, speaking)
    if speaking is not None:
        print_summary(speaking, result)
    interrupted = result.summary is not None and result.summary.interrupted
    return Finished(result.exit_code, result.run_dir, interrupted, info.is_main, info.world_size)
