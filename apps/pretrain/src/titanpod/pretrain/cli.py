"""``titanpod-pretrain``: pick a recipe, override any field, train, and report.

titanpod-pretrain                                  # llama3_debug on this machine
titanpod-pretrain --list-recipes
titanpod-pretrain --recipe llama3_debug --train.steps 20 --device.lane cpu
titanpod-pretrain --output.run-name try1 --resume   # continue try1 from its newest checkpoint
titanpod-pretrain --resume                         # continue the newest run of the recipe that has one
titanpod-pretrain --recipe llama3_405b --dry-run   # memory per device and step time on its target slice
titanpod-pretrain --recipe llama3_405b --dry-run --chip v5p --chips 512
titanpod-pretrain --recipe llama3_405b --rehearse  # run it here, small, with every setting, and check resume
titanpod-pretrain --recipe runs/try1/recipe.json   # a recipe file (any run's recipe.json)
titanpod-pretrain --help                           # every field of the recipe
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import tyro
from rich.console import Console
from rich.table import Table

from titanpod.device import process_info
from titanpod.recipes import DEFAULT_RECIPE, RECIPES, Recipe, get_recipe
from titanpod.recipes.errors import print_error
from titanpod.recipes.planner.report import dry_run
from titanpod.runs import PretrainResult, run_pretraining
from titanpod.runs.pretrain import with_resume
from titanpod.runs.process_exit import exit_rank, run_exit_code
from titanpod.runs.rehearsal import rehearse


@dataclasses.dataclass(frozen=True)
class Command:
    """What the command line asks for: a recipe, and whether to train it or only plan it."""

    recipe: Recipe
    """The recipe with every override applied."""
    dry_run: bool = False
    """Plan on the recipe's target slice instead of training."""
    rehearse: bool = False
    """Run the recipe on this machine at a small size with every setting it makes, and check it resumes exactly."""
    rehearse_lanes: tuple[str, ...] | None = None
    """Lanes to rehearse on (``cpu``, ``xla``); ``None``: the recipe's, or both for a TPU recipe."""


def parse_command(argv: list[str]) -> Command | None:
    """The recipe named by ``--recipe`` with the remaining flags applied; ``None`` after ``--list-recipes``.

    ``--chip`` and ``--chips`` are short for ``--target.chip`` and ``--target.chips``.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--recipe", default=DEFAULT_RECIPE)
    parser.add_argument("--list-recipes", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--rehearse", action="store_true")
    parser.add_argument("--rehearse-lanes")
    parser.add_argument("--chip")
    parser.add_argument("--chips")
    known, rest = parser.parse_known_args(argv)
    if known.chip is not None:
        rest += ["--target.chip", known.chip]
    if known.chips is not None:
        rest += ["--target.chips", known.chips]
    if known.list_recipes:
        for name, build in RECIPES.items():
            print(f"{name:24s} {(build.__doc__ or '').strip().splitlines()[0]}")
        return None
    base = load_recipe_file(Path(known.recipe)) if known.recipe.endswith(".json") else get_recipe(known.recipe)
    recipe = tyro.cli(
        Recipe,
        default=base,
        args=rest,
        prog="titanpod-pretrain",
        description=(
            f"Train the recipe chosen with --recipe NAME (default {DEFAULT_RECIPE}; see --list-recipes). "
            f"Every field below overrides it. Now showing: {known.recipe}. --dry-run plans the recipe on "
            "--chips (--target.chips) chips of kind --chip (--target.chip) without training."
        ),
        config=(tyro.conf.FlagConversionOff,),
    )
    lanes = None
    if known.rehearse_lanes is not None:
        lanes = tuple(lane.strip() for lane in known.rehearse_lanes.split(",") if lane.strip())
        unknown = sorted(set(lanes) - {"cpu", "xla"})
        if unknown or not lanes:
            raise ValueError(f"--rehearse-lanes takes cpu, xla or cpu,xla; got {known.rehearse_lanes!r}.")
    return Command(
        with_resume(recipe) if known.resume else recipe,
        dry_run=known.dry_run,
        rehearse=known.rehearse,
        rehearse_lanes=lanes,
    )


def load_recipe_file(path: Path) -> Recipe:
    """The recipe saved in ``path`` (a run's recipe.json); ``ValueError`` names the file and what is wrong."""
    if not path.is_file():
        raise ValueError(
            f"--recipe {path}: no such recipe file; give a recipe.json path or a name from --list-recipes."
        )
    try:
        return Recipe.load(path)
    except (ValueError, TypeError) as error:  # bad JSON, unknown or mistyped fields
        raise ValueError(f"--recipe {path} is not a recipe file titanpod can read: {error}") from error


def parse_recipe(argv: list[str]) -> Recipe | None:
    """The recipe the command line describes; ``None`` after ``--list-recipes``."""
    command = parse_command(argv)
    return None if command is None else command.recipe


def print_summary(console: Console, result: PretrainResult) -> None:
    """A short table of what the run did and where it wrote."""
    summary = result.summary
    losses = summary.losses
    window = min(10, len(losses))
    table = Table(title="titanpod-pretrain summary", show_header=False)
    table.add_row("lane", result.lane)
    table.add_row("parameters", f"{result.parameters:,}")
    table.add_row("steps", f"{summary.steps_done}" + (" (interrupted)" if summary.interrupted else ""))
    table.add_row("step mode", result.step_description)
    if summary.skipped_steps:
        table.add_row("skipped (NaN/Inf gradients)", ", ".join(map(str, summary.skipped_steps)))
    if losses:
        table.add_row(f"loss, first {window} steps (mean)", f"{statistics.fmean(losses[:window]):.4f}")
        table.add_row(f"loss, last {window} steps (mean)", f"{statistics.fmean(losses[-window:]):.4f}")
    table.add_row("tokens/s (after step 1)", f"{summary.tokens_per_second:,.0f}")
    table.add_row("MFU", f"{summary.mfu:.1%}")
    peak = summary.peak_memory_gib
    table.add_row("peak memory", "unavailable" if peak is None else f"{peak:.2f} GiB")
    table.add_row("wall time", f"{summary.wall_seconds:.1f} s")
    console.print(table)
    console.print(f"run directory: {result.run_dir} (recipe.json, metrics.jsonl, tensorboard/)", soft_wrap=True)
    console.print(f"weights: {result.weights_path or 'not saved'}", soft_wrap=True)
    if summary.stopped_because:
        console.print(f"[bold red]stopped[/] at {summary.stopped_because}", soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``titanpod-pretrain``; returns the process exit code."""
    console = Console()
    try:
        command = parse_command(sys.argv[1:] if argv is None else argv)
    except (KeyError, ValueError) as error:
        print_error(error)
        return 2
    if command is None:
        return 0
    recipe = command.recipe
    if command.dry_run:
        try:
            plan = dry_run(recipe, console)
        except (KeyError, ValueError) as error:  # PlanError is a ValueError
            print_error(error)
            return 2
        return 0 if plan.fits else 1
    if command.rehearse:
        return rehearse_command(recipe, command.rehearse_lanes, console)
    main_process = process_info().is_main  # under torchrun only rank 0 speaks
    if main_process:
        console.print_json(recipe.to_json())
    try:
        result = run_pretraining(recipe, console if main_process else None)
    except (KeyError, ValueError, RuntimeError, OSError) as error:  # NotImplementedError is a RuntimeError
        print_error(error)
        return 1
    if main_process:
        print_summary(console, result)
    code = run_exit_code(result.summary)
    if process_info().world_size > 1:
        exit_rank(code)  # once the run is written: see exit_rank
    return code


def rehearse_command(recipe: Recipe, lanes: tuple[str, ...] | None, console: Console) -> int:
    """``--rehearse``: 0 when every lane's small run of the recipe trained, learnt and resumed exactly."""
    folder = Path(recipe.output.runs_dir) / f"rehearse-{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        report = rehearse(recipe, folder, console, lanes)
    except (KeyError, ValueError, OSError) as error:  # RehearsalError is a ValueError
        print_error(error)
        return 2
    except KeyboardInterrupt:  # the run in flight was stopped with its processes; its logs stay
        print_error(RuntimeError(f"rehearsal interrupted; the runs and logs so far are in {folder}"))
        return 130
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
