"""What ``titanpod-pretrain`` does with its command line (``titanpod.pretrain.cli`` is its entry): parse it into a
recipe, then print, plan, compile, rehearse or train it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from titanpod.recipes import DEFAULT_RECIPE, RECIPES, Recipe, get_recipe
from titanpod.recipes.app import Finished
from titanpod.recipes.command_flags import RecipeCommand, ResumeFlag, SliceFlags
from titanpod.recipes.command_line import (
    flag_value,
    listing_line,
    optional_value,
    parse_args,
    recipe_argument,
    split_lanes,
    with_steps_scaled,
)
from titanpod.recipes.errors import print_error
from titanpod.recipes.recipe_files import is_recipe_file
from titanpod.recipes.recipe_files import load_recipe_file as read_recipe_file

if TYPE_CHECKING:
    from titanpod.runs import PretrainResult


@dataclasses.dataclass(frozen=True)
class Command(SliceFlags, ResumeFlag, RecipeCommand[Recipe]):
    """What the command line asks for: a recipe, and whether to train it, plan it, rehearse it or print it."""

    compile_for: str | None = None
    """Compile the whole training step for a TPU slice (``v5p-8``, ``v6e-256``; ``target``: the recipe's own) with
    libtpu on this host, without TPUs or weights, and report memory a chip, flops, the compiler's estimated step
    time and the collectives (needs the tpu environment: ``cd envs/tpu && uv run titanpod-pretrain ...``)."""
    compile_layers: tuple[int, ...] = ()
    """With --compile-for: compile the model cut to this many layers; two depths (``2 4``) compile both and
    extrapolate the whole model's figures by depth."""


def parse_command(argv: list[str]) -> Command | None:
    """The recipe named by ``--recipe`` with the remaining flags applied; ``None`` after ``--list-recipes``.

    ``--resume`` continues a run as its ``recipe.json`` says: that recipe, with the flags given applied, unless
    ``--recipe`` names a recipe file (a ``--recipe NAME`` must be the run's own). ``--chip`` and ``--chips`` are
    short for ``--target.chip`` and ``--target.chips``. A value tyro refuses (a choice that does not exist, a
    number that is not one) raises ``SystemExit(2)`` after saying so on stderr.
    """
    name = recipe_argument(argv, DEFAULT_RECIPE)
    base = load_recipe_file(Path(name)) if is_recipe_file(name) else get_recipe(name)
    resuming = any(arg.partition("=")[0] == "--resume" for arg in optional_value(argv, "--resume"))
    command = _parse(argv, base if resuming else with_steps_scaled(base, argv), name)
    if command.list_recipes:
        for recipe_name, build in RECIPES.items():
            print(listing_line(recipe_name, build.__doc__, 24))
        return None
    recipe = command.recipe
    if command.resume is not None:
        from titanpod.runs.run_lookup import recorded_recipe_file, resume_base, with_recorded_run, with_resume

        recipe = with_resume(recipe, command.resume)
        recorded = recorded_recipe_file(recipe)
        if recorded is not None and not is_recipe_file(name):  # the run's own recipe, the flags given on top
            explicit = flag_value(argv, "--recipe")
            saved = load_recipe_file(recorded)
            if explicit is not None and explicit != saved.name:
                raise ValueError(
                    f"--recipe {explicit}, but the run {recipe.output.run_name} is a run of {saved.name} "
                    f"({recorded}): leave --recipe out to continue it as it ran, or start a new run without --resume."
                )
            command = _parse(argv, resume_base(saved), name)
            recipe = with_recorded_run(command.recipe, recipe)
    return dataclasses.replace(command, recipe=command.with_target_chips(recipe))


def _parse(argv: list[str], base: Recipe, name: str) -> Command:
    """``argv`` parsed over the recipe ``base`` (named ``name`` in the help)."""
    return parse_args(
        Command,
        Command(recipe=base, recipe_name=name),
        optional_value(split_lanes(argv), "--resume"),
        prog="titanpod-pretrain",
        description=(
            f"Train the recipe chosen with --recipe (default {DEFAULT_RECIPE}; see --list-recipes), or plan "
            f"(--dry-run), rehearse (--rehearse) or print it (--print-recipe). Every recipe field below overrides "
            f"it; the defaults shown are those of {name}."
        ),
        recipe_type=Recipe,
    )


def load_recipe_file(path: Path) -> Recipe:
    """The recipe in ``path`` (a run's recipe.json, or a TOML file; see ``titanpod.recipes.recipe_files``);
    ``ValueError`` names the file and what is wrong."""
    return read_recipe_file(path, get_recipe, lambda data: Recipe)


def parse_recipe(argv: list[str]) -> Recipe | None:
    """The recipe the command line describes; ``None`` after ``--list-recipes``."""
    command = parse_command(argv)
    return None if command is None else command.recipe


def print_summary(console: Console, result: PretrainResult) -> None:
    """A short table of what the run did and where it wrote."""
    from titanpod.runs.summary_rows import loss_rows, mfu_text

    summary = result.summary
    table = Table(title="titanpod-pretrain summary", show_header=False)
    table.add_row("lane", result.lane)
    table.add_row("parameters", f"{result.parameters:,}")
    table.add_row("steps", f"{summary.steps_done}" + (" (interrupted)" if summary.interrupted else ""))
    table.add_row("step mode", result.step_description)
    if summary.skipped_steps:
        table.add_row("skipped (NaN/Inf gradients)", ", ".join(map(str, summary.skipped_steps)))
    for label, value in loss_rows(summary.losses):
        table.add_row(label, value)
    table.add_row("tokens/s (after step 1)", f"{summary.tokens_per_second:,.0f}")
    table.add_row("MFU", mfu_text(summary))
    if summary.compile_seconds is not None:
        how = {"hit": "loaded from the compiled-step cache", "miss": "compiled, then cached", "off": "compiled"}
        table.add_row("whole-step compile", f"{summary.compile_seconds:.1f} s ({how[summary.compile_cache or 'off']})")
    peak = summary.peak_memory_gib
    table.add_row("peak memory", "unavailable" if peak is None else f"{peak:.2f} GiB")
    table.add_row("wall time", f"{summary.wall_seconds:.1f} s")
    console.print(table)
    held = [name for name in ("recipe.json", "metrics.jsonl", "tensorboard/") if (result.run_dir / name).exists()]
    console.print(f"run directory: {result.run_dir} ({', '.join(held) or 'nothing written yet'})", soft_wrap=True)
    console.print(f"weights: {result.weights_path or 'not saved'}", soft_wrap=True)
    if summary.stopped_because:
        console.print(f"[bold red]stopped[/] at {summary.stopped_because}", soft_wrap=True)


parse = parse_command
"""The command ``argv`` asks for (``titanpod.recipes.app.AppCommands``)."""


def act(command: Command, console: Console) -> int | None:
    """``--print-recipe``, ``--dry-run``, ``--compile-for`` and ``--rehearse``: the exit status; ``None`` to train."""
    recipe = command.recipe
    if command.print_recipe:
        print(recipe.to_json(), end="")
        return 0
    if command.dry_run:
        from titanpod.recipes.planner.report import dry_run

        plan = dry_run(recipe, console)  # PlanError is a ValueError: exit status 2
        return 0 if plan.fits else 1
    if command.compile_for is not None:
        return compile_command(command, console)
    if command.rehearse:
        from titanpod.runs.rehearsal import rehearse
        from titanpod.runs.rehearsal.command import rehearse_command

        return rehearse_command(recipe, command.rehearse_lanes, console, rehearse)
    return None


def train(command: Command, console: Console) -> Finished:
    """Train the recipe; the main process (rank 0 under torchrun) prints the header and the summary. A run resumed
    with every step done says so and how to extend it, and ends with status 0 having written nothing."""
    from titanpod.device import process_info
    from titanpod.runs import run_pretraining
    from titanpod.runs.process_exit import run_exit_code
    from titanpod.runs.resume_check import RunFinished

    info = process_info()
    speaking = console if info.is_main else None
    try:
        result = run_pretraining(command.recipe, speaking)
    except RunFinished as finished:  # nothing to train: said, and the run's files left as they are
        if speaking is not None:
            speaking.print(escape(str(finished)), soft_wrap=True)
        return Finished(0, None, False, info.is_main, info.world_size)
    if speaking is not None:
        print_summary(speaking, result)
    summary = result.summary
    return Finished(run_exit_code(summary), result.run_dir, summary.interrupted, info.is_main, info.world_size)


def compile_command(command: Command, console: Console) -> int:
    """``--compile-for SLICE``: 0 when the step compiled for the slice fits a chip, 1 when not, 2 on bad input."""
    from titanpod.runs.slice_compile_command import compile_for_command

    try:
        return compile_for_command(
            command.recipe,
            command.compile_for or "target",
            console,
            layers=command.compile_layers,
            output_dir=command.compile_output,
            keep_program=command.compile_keep_program,
        )
    except (KeyError, ValueError, RuntimeError) as error:
        print_error(error)
        return 2
