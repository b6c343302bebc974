"""``titanpod-posttrain``: post-train a language model from a recipe (supervised fine-tuning, GRPO).

titanpod-posttrain                                   # sft_debug: the llama3 debug model learns to reverse strings
titanpod-posttrain --list-recipes
titanpod-posttrain --recipe sft_debug --train.steps 50 --eval.examples 100
titanpod-posttrain --model.init-from runs/sft_debug-.../model   # start from a finished run's weights
titanpod-posttrain --data.source jsonl --data.path chats.jsonl --eval.task reverse
titanpod-posttrain --output.run-name try1 --resume   # continue try1 from its newest checkpoint
titanpod-posttrain --recipe grpo_debug --model.init-from runs/sft200/model         # GRPO from an SFT model
titanpod-posttrain --recipe grpo_debug --model.init-from runs/sft200/model --rollout.mode ray --rollout.workers 2
titanpod-posttrain --help                            # every field of the recipe"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import tyro
from rich.console import Console
from rich.table import Table

from titanpod.device import process_info
from titanpod.recipes.errors import print_error
from titanpod.recipes.posttrain.registry import (
    DEFAULT_POSTTRAIN_RECIPE,
    POSTTRAIN_RECIPES,
    PosttrainRecipe,
    get_posttrain_recipe,
)
from titanpod.rl.grpo.run import run_grpo
from titanpod.runs.pretrain import with_resume
from titanpod.runs.process_exit import exit_rank
from titanpod.runs.sft import run_sft


class PosttrainResult(Protocol):
    """What every post-training runner returns."""

    run_dir: Path
    """The run directory."""

    @property
    def exit_code(self) -> int:
        """The process exit code the run deserves (``titanpod.runs.process_exit.run_exit_code``)."""
        ...

    def summary_rows(self) -> list[tuple[str, str]]:
        """The run's summary as (label, value) rows."""
        ...


RUNNERS: Mapping[str, Callable[[Any, Console | None], PosttrainResult]] = {"sft": run_sft, "grpo": run_grpo}
"""The runner of each recipe kind."""


@dataclasses.dataclass(frozen=True)
class Command:
    """What the command line asks for: a recipe with its overrides, and the entry that runs it."""

    entry: PosttrainRecipe
    """The named recipe's entry (its kind and runner)."""
    recipe: Any
    """The recipe with every override applied."""


def parse_command(argv: list[str]) -> Command | None:
    """The recipe named by ``--recipe`` with the remaining flags applied; ``None`` after ``--list-recipes``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--recipe", default=DEFAULT_POSTTRAIN_RECIPE)
    parser.add_argument("--list-recipes", action="store_true")
    parser.add_argument("--resume", action="store_true")
    known, rest = parser.parse_known_args(argv)
    if known.list_recipes:
        for name, entry in POSTTRAIN_RECIPES.items():
            print(f"{name:20s} {entry.kind:5s} {entry.description}")
        return None
    entry = get_posttrain_recipe(known.recipe)
    base = entry.build()
    recipe = tyro.cli(
        type(base),
        default=base,
        args=rest,
        prog="titanpod-posttrain",
        description=(
            f"Post-train with the recipe chosen with --recipe NAME (default {DEFAULT_POSTTRAIN_RECIPE}; see "
            f"--list-recipes). Every field below overrides it. Now showing: {known.recipe} ({entry.kind}). "
            "--resume continues --output.run-name (or the newest run of the recipe) from its newest checkpoint."
        ),
        config=(tyro.conf.FlagConversionOff,),
    )
    return Command(entry, with_resume(recipe) if known.resume else recipe)


def print_summary(console: Console, result: PosttrainResult) -> None:
    """The run's summary rows as a table."""
    table = Table(title="titanpod-posttrain summary", show_header=False)
    for label, value in result.summary_rows():
        table.add_row(label, value)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``titanpod-posttrain``; returns the process exit code."""
    console = Console()
    try:
        command = parse_command(sys.argv[1:] if argv is None else argv)
    except (KeyError, ValueError) as error:
        print_error(error)
        return 2
    if command is None:
        return 0
    main_process = process_info().is_main  # under torchrun only rank 0 speaks
    if main_process:
        console.print_json(command.recipe.to_json())
    try:
        result = RUNNERS[command.entry.kind](command.recipe, console if main_process else None)
    # NotImplementedError is a RuntimeError; ImportError names a missing optional dependency (Ray).
    except (KeyError, ValueError, RuntimeError, OSError, ImportError) as error:
        print_error(error)
        return 1
    if main_process:
        print_summary(console, result)
    if process_info().world_size > 1:
        exit_rank(result.exit_code)  # once the run is written: see exit_rank
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
