"""``titanpod-posttrain``: post-train a language model from a recipe (supervised fine-tuning, GRPO).

titanpod-posttrain                                   # sft_debug: the llama3 debug model learns to reverse strings
titanpod-posttrain --list-recipes
titanpod-posttrain --recipe sft_debug --train.steps 50 --eval.examples 100
titanpod-posttrain --model.init-from runs/sft_debug-.../model   # start from a finished run's weights
titanpod-posttrain --data.source jsonl --data.path chats.jsonl --eval.task reverse
titanpod-posttrain --resume try1                     # continue the run try1 from its newest checkpoint
titanpod-posttrain --recipe sft_arith --output.run-name sft_arith                   # SFT on the word problems
titanpod-posttrain --recipe grpo_debug --model.init-from runs/sft_arith/model       # GRPO from that SFT model
titanpod-posttrain --recipe grpo_debug --model.init-from runs/sft_arith/model --rollout.mode ray --rollout.workers 2
titanpod-posttrain --recipe grpo_debug --model.init-from runs/sft/model --grpo.data-path mine.jsonl
    --grpo.reward-function my_rewards:score        # your prompts and answers (one command), your reward
titanpod-posttrain --recipe grpo_debug --model.init-from runs/sft_arith/model --dry-run --devices 2
                                                   # memory per device: trainer and rollout engine
titanpod-posttrain --recipe mine.toml --print-recipe  # a TOML file (base = "sft_debug" plus what differs), resolved
titanpod-posttrain --help                            # every flag, and every field of the recipe"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Generic, Protocol, TypeVar

import tyro
from rich.console import Console
from rich.table import Table

from titanpod.device import process_info
from titanpod.posttrain.dry_run import grpo_dry_run
from titanpod.recipes.command_line import first_sentence, optional_value, parse_args, recipe_argument
from titanpod.recipes.errors import print_error
from titanpod.recipes.posttrain.grpo_recipe import GRPORecipe
from titanpod.recipes.posttrain.registry import (
    DEFAULT_POSTTRAIN_RECIPE,
    POSTTRAIN_RECIPES,
    get_posttrain_recipe,
)
from titanpod.recipes.posttrain.sft_recipe import SFTRecipe
from titanpod.recipes.recipe_files import is_recipe_file, load_recipe_file
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


RecipeT = TypeVar("RecipeT")


@dataclasses.dataclass(frozen=True)
class Command(Generic[RecipeT]):
    """What the command line asks for: a recipe with its overrides, its kind, and whether to run or print it."""

    recipe: Annotated[RecipeT, tyro.conf.arg(name="")]
    """The recipe with every override applied."""
    recipe_name: Annotated[str, tyro.conf.arg(name="recipe")] = DEFAULT_POSTTRAIN_RECIPE
    """A recipe name (see --list-recipes), or a recipe file: a run's recipe.json, or a TOML file with
    ``base = "NAME"`` and the fields that differ. It gives every other flag its default."""
    list_recipes: tyro.conf.FlagCreatePairsOff[bool] = False
    """List the named recipes and exit."""
    print_recipe: tyro.conf.FlagCreatePairsOff[bool] = False
    """Print the resolved recipe as JSON (a recipe file --recipe reads back) and exit without running."""
    dry_run: tyro.conf.FlagCreatePairsOff[bool] = False
    """GRPO recipes: print the memory one device needs (the trainer's share, the KL reference, the rollout
    engine's weights in its inference dtype and its KV cache) on --devices devices, and exit without running."""
    devices: int = 1
    """The devices (one process each) --dry-run plans for."""
    resume: Annotated[str | None, tyro.conf.arg(metavar="[NAME]")] = None
    """Continue a run from its newest checkpoint: --resume NAME, the run directory NAME under --output.runs-dir
    (or the run started as --output.run-name NAME); --resume alone, --output.run-name or else the newest run of
    the recipe that has a checkpoint."""

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
            print(f"{recipe_name:20s} {entry.kind:5s} {first_sentence(entry.description)}")
        return None
    if command.resume is None:
        return command
    return dataclasses.replace(command, recipe=with_resume(command.recipe, command.resume))


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
    if command.print_recipe:
        print(command.recipe.to_json(), end="")
        return 0
    if command.dry_run:
        if command.kind != "grpo":
            print_error(ValueError("--dry-run plans GRPO recipes: pick one with --recipe (e.g. grpo_debug)."))
            return 2
        try:
            grpo_dry_run(command.recipe, command.devices, console)
        except (KeyError, ValueError, OSError) as error:
            print_error(error)
            return 2
        return 0
    main_process = process_info().is_main  # under torchrun only rank 0 speaks
    if main_process:
        console.print_json(command.recipe.to_json())
    try:
        result = RUNNERS[command.kind](command.recipe, console if main_process else None)
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
