"""What ``titanpod-diffusion`` does with its command line (``titanpod.diffusion.cli`` is its entry): parse it into
a recipe, then print, plan, compile, rehearse or train it, or draw images from a finished run (``sample``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import tyro
from rich.console import Console
from rich.table import Table

from titanpod.recipes.app import Finished
from titanpod.recipes.command_flags import RecipeCommand, SliceFlags
from titanpod.recipes.command_line import (
    PlainHelpRegistry,
    listing_line,
    parse_args,
    recipe_argument,
    split_lanes,
    with_steps_scaled,
)
from titanpod.recipes.diffusion import DiffusionRecipe
from titanpod.recipes.diffusion.registry import DEFAULT_DIFFUSION_RECIPE, DIFFUSION_RECIPES, get_diffusion_recipe
from titanpod.recipes.errors import print_error
from titanpod.recipes.recipe_files import is_recipe_file, load_recipe_file

if TYPE_CHECKING:
    from titanpod.runs.diffusion.run import DiffusionResult


@dataclasses.dataclass(frozen=True)
class TrainCommand(SliceFlags, RecipeCommand[DiffusionRecipe]):
    """What the command line asks for: a recipe, and whether to train it, plan it, rehearse it or print it."""

    compile_for: str | None = None
    """Compile the whole training step for a TPU slice (``v5p-16``, ``v5p-8``; ``target``: the recipe's own) with
    libtpu on this host, without TPUs or weights, and report memory a chip, flops, the compiler's estimated step
    time and the collectives (needs the tpu environment: ``cd envs/tpu && uv run titanpod-diffusion ...``)."""
    compile_layers: tuple[int, ...] = ()
    """With --compile-for: compile the transformer cut to this many blocks, in FLUX's proportion of double- to
    single-stream blocks (a multiple of 3 for FLUX.1); two counts (``3 6``) compile both and extrapolate the whole
    model's figures by depth."""

    @property
    def action(self) -> str:
        """What to do with the recipe: ``print``, ``dry_run``, ``compile``, ``rehearse`` or ``train``."""
        chosen = {
            "print": self.print_recipe,
            "dry_run": self.dry_run,
            "compile": self.compile_for is not None,
            "rehearse": self.rehearse,
        }
        return next((name for name, on in chosen.items() if on), "train")


@dataclasses.dataclass(frozen=True)
class SampleCommand:
    """Draw images from a finished titanpod-diffusion run's transformer, one per prompt, into one PNG grid."""

    checkpoint: str
    """A run directory (holding recipe.json and transformer/)."""
    prompt: tyro.conf.UseAppendAction[tuple[str, ...]]
    """A prompt; repeat --prompt for more images."""
    steps: int | None = None
    """Euler steps; ``None``: the recipe's ``samples.steps``."""
    cfg_scale: float | None = None
    """Classifier-free guidance; ``None``: the recipe's ``samples.cfg_scale``."""
    cfg_stop: float | None = None
    """The timestep where guidance stops (0: guidance on every step); ``None``: the recipe's ``samples.cfg_stop``."""
    seed: int = 0
    """Seed of the starting noise."""
    out: str | None = None
    """PNG to write; ``None``: ``<checkpoint>/samples/sample.png``."""


def load_recipe(name: str) -> DiffusionRecipe:
    """The named recipe, or the recipe in file ``name`` (.json or .toml); errors name the recipe or the file."""
    if is_recipe_file(name):
        return load_recipe_file(Path(name), get_diffusion_recipe, lambda data: DiffusionRecipe)
    return get_diffusion_recipe(name)


def parse_train(argv: list[str]) -> TrainCommand | None:
    """The command: the recipe with every override applied and what to do with it (``action``: ``train``,
    ``dry_run``, ``rehearse`` or ``print``); ``None`` after ``--list-recipes``. A value tyro refuses raises
    ``SystemExit(2)``."""
    name = recipe_argument(argv, DEFAULT_DIFFUSION_RECIPE)
    command = parse_args(
        TrainCommand,
        TrainCommand(recipe=with_steps_scaled(load_recipe(name), argv), recipe_name=name),
        split_lanes(argv),
        prog="titanpod-diffusion",
        description=(
            f"Train the diffusion recipe chosen with --recipe (default {DEFAULT_DIFFUSION_RECIPE}; see "
            "--list-recipes), or plan (--dry-run), rehearse (--rehearse) or print it (--print-recipe). Every recipe "
            f"field below overrides it; the defaults shown are those of {name}. Images from a finished run: "
            "titanpod-diffusion sample --help."
        ),
        recipe_type=DiffusionRecipe,
    )
    if command.list_recipes:
        for recipe_name, build in DIFFUSION_RECIPES.items():
            print(listing_line(recipe_name, build.__doc__, 16))
        return None
    return dataclasses.replace(command, recipe=command.with_target_chips(command.recipe))


def compile_command(command: TrainCommand, console: Console) -> int:
    """``--compile-for SLICE``: 0 when the step compiled for the slice fits a chip, 1 when not, 2 on bad input."""
    from titanpod.runs.diffusion.slice_compile import compile_diffusion_for_slice, cost_depths
    from titanpod.runs.slice_compile_command import compile_for_command

    try:
        return compile_for_command(
            command.recipe,
            command.compile_for or "target",
            console,
            layers=command.compile_layers,
            output_dir=command.compile_output,
            keep_program=command.compile_keep_program,
            compile_one=compile_diffusion_for_slice,
            cost_depths=cost_depths(command.recipe),
        )
    except (KeyError, ValueError, RuntimeError) as error:
        print_error(error)
        return 2


def parse_sample(argv: list[str]) -> SampleCommand:
    """``titanpod-diffusion sample ...``: what to draw, from which run (``SystemExit(2)`` for a refused value)."""
    return tyro.cli(SampleCommand, args=argv, prog="titanpod-diffusion sample", registry=PlainHelpRegistry())


def sample_command(args: SampleCommand, console: Console) -> int:
    """``titanpod-diffusion sample``: images from a finished run's transformer."""
    import torch

    from titanpod.data.images import save_image_grid
    from titanpod.recipes.diffusion.recipe import SampleConfig
    from titanpod.runs.diffusion.components import build_diffusion_models
    from titanpod.runs.diffusion.run import TRANSFORMER_FOLDER
    from titanpod.runs.diffusion.sampling import generate

    if not args.prompt:
        raise ValueError("titanpod-diffusion sample draws one image per --prompt: give at least one.")
    run_dir = Path(args.checkpoint)
    if not (run_dir / "recipe.json").is_file() or not (run_dir / TRANSFORMER_FOLDER).is_dir():
        raise FileNotFoundError(
            f"{run_dir} is not a finished titanpod-diffusion run: it needs recipe.json and {TRANSFORMER_FOLDER}/."
        )
    recipe = DiffusionRecipe.load(run_dir / "recipe.json")
    model = dataclasses.replace(recipe.model, transformer_weights=str(run_dir / TRANSFORMER_FOLDER))
    models = build_diffusion_models(dataclasses.replace(recipe, model=model), torch.device("cpu"))
    prompts = list(args.prompt)
    config = SampleConfig(
        prompts=len(prompts),
        steps=args.steps or recipe.samples.steps,
        cfg_scale=recipe.samples.cfg_scale if args.cfg_scale is None else args.cfg_scale,
        cfg_stop=recipe.samples.cfg_stop if args.cfg_stop is None else args.cfg_stop,
        seed=args.seed,
    )
    images = generate(models, prompts, recipe.data.resolution, config, recipe.model.guidance)
    out = save_image_grid(images, args.out or run_dir / "samples" / "sample.png", captions=prompts)
    console.print(f"wrote {out}", soft_wrap=True)
    return 0


def print_summary(console: Console, result: DiffusionResult) -> None:
    """What the run did and where it wrote."""
    from titanpod.runs.summary_rows import loss_rows, mfu_text

    table = Table(title="titanpod-diffusion summary", show_header=False)
    table.add_row("parameters", f"{result.parameters:,}")
    table.add_row("steps", str(result.summary.steps_done) + (" (interrupted)" if result.summary.interrupted else ""))
    for label, value in loss_rows(result.summary.losses):
        table.add_row(label, value)
    table.add_row("samples/s (after step 1)", f"{result.samples_per_second:,.1f}")
    table.add_row("MFU", mfu_text(result.summary))
    table.add_row("wall time", f"{result.summary.wall_seconds:.1f} s")
    if result.prompt_checks:
        passed = sum(check.passed for check in result.prompt_checks)
        table.add_row("prompts followed (pixel check)", f"{passed} of {len(result.prompt_checks)}")
    console.print(table)
    console.print(f"run directory: {result.run_dir}", soft_wrap=True)
    for path in result.samples:
        console.print(f"samples: {path}", soft_wrap=True)
    console.print(f"transformer: {result.transformer_path or 'not saved'}", soft_wrap=True)


def parse(argv: list[str]) -> TrainCommand | SampleCommand | None:
    """The command ``argv`` asks for (``titanpod.recipes.app.AppCommands``): ``sample ...`` draws images, anything
    else trains (``parse_train``)."""
    if argv[:1] == ["sample"]:
        return parse_sample(argv[1:])
    return parse_train(argv)


def act(command: TrainCommand | SampleCommand, console: Console) -> int | None:
    """``sample``, ``--compile-for``, ``--print-recipe``, ``--rehearse`` and ``--dry-run``: the exit status;
    ``None`` to train."""
    if isinstance(command, SampleCommand):
        try:
            return sample_command(command, console)
        except (RuntimeError, OSError) as error:
            print_error(error)
            return 1
    recipe, action = command.recipe, command.action
    if action == "compile":
        return compile_command(command, console)
    if action == "print":
        print(recipe.to_json(), end="")
        return 0
    if action == "rehearse":
        from titanpod.runs.rehearsal.command import rehearse_command
        from titanpod.runs.rehearsal.diffusion import rehearse_diffusion

        return rehearse_command(recipe, command.rehearse_lanes, console, rehearse_diffusion)
    if action == "dry_run":
        from titanpod.recipes.planner.flux import flux_plan_table, plan_flux
        from titanpod.recipes.planner.host_table import print_host
        from titanpod.recipes.planner.report import target_chip

        plan = plan_flux(recipe, target_chip(recipe.target.chip), recipe.target.chips, recipe.target.mfu)
        console.print(flux_plan_table(plan))
        print_host(console, recipe.name, plan.host)
        return 0 if plan.fits else 1
    return None


def train(command: TrainCommand, console: Console) -> Finished:
    """Train the recipe; under torchrun rank 0 alone prints the summary."""
    from titanpod.runs.diffusion.run import run_diffusion
    from titanpod.runs.process_exit import run_exit_code

    result = run_diffusion(command.recipe, console)
    if result.is_main:
        print_summary(console, result)
    summary = result.summary
    return Finished(run_exit_code(summary), result.run_dir, summary.interrupted, result.is_main, result.processes)
