"""``titanpod-diffusion``: train a FLUX.1 transformer by flow matching, plan it, or draw images from a run.

titanpod-diffusion                                   # flux_debug on the built-in shapes, on this machine
titanpod-diffusion --list-recipes
titanpod-diffusion --recipe flux1_12b --dry-run      # memory per device and step time on its target slice
titanpod-diffusion --recipe flux1_12b --rehearse     # run it here, small, with every setting (see README)
titanpod-diffusion --train.steps 100 --data.batch-size 8
titanpod-diffusion sample --checkpoint runs/flux_debug-... --prompt "a large red circle on the left"
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import tyro
from rich.console import Console
from rich.table import Table

from titanpod.recipes.diffusion import (
    DEFAULT_DIFFUSION_RECIPE,
    DIFFUSION_RECIPES,
    DiffusionRecipe,
    get_diffusion_recipe,
)
from titanpod.recipes.errors import print_error
from titanpod.runs.diffusion.run import DiffusionResult, run_diffusion
from titanpod.runs.process_exit import exit_rank, run_exit_code


def parse_train(argv: list[str]) -> tuple[DiffusionRecipe, str] | None:
    """The recipe with every override applied and what to do with it (``train``, ``dry_run`` or
    ``rehearse``); ``None`` after ``--list-recipes``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--recipe", default=DEFAULT_DIFFUSION_RECIPE)
    parser.add_argument("--list-recipes", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--rehearse", action="store_true")
    parser.add_argument("--chip")
    parser.add_argument("--chips")
    known, rest = parser.parse_known_args(argv)
    if known.list_recipes:
        for name, build in DIFFUSION_RECIPES.items():
            print(f"{name:16s} {(build.__doc__ or '').strip()}")
        return None
    rest += ["--target.chip", known.chip] if known.chip else []
    rest += ["--target.chips", known.chips] if known.chips else []
    recipe = tyro.cli(
        DiffusionRecipe,
        default=get_diffusion_recipe(known.recipe),
        args=rest,
        prog="titanpod-diffusion",
        description=f"Train the diffusion recipe chosen with --recipe (default {DEFAULT_DIFFUSION_RECIPE}).",
        config=(tyro.conf.FlagConversionOff,),
    )
    return recipe, "dry_run" if known.dry_run else "rehearse" if known.rehearse else "train"


def sample_command(argv: list[str], console: Console) -> int:
    """``titanpod-diffusion sample``: images from a finished run's transformer."""
    from titanpod.data.images import save_image_grid
    from titanpod.recipes.diffusion.recipe import SampleConfig
    from titanpod.runs.diffusion.components import build_diffusion_models
    from titanpod.runs.diffusion.run import TRANSFORMER_FOLDER
    from titanpod.runs.diffusion.sampling import generate

    parser = argparse.ArgumentParser(prog="titanpod-diffusion sample", description=sample_command.__doc__)
    parser.add_argument("--checkpoint", required=True, help="a run directory (holding recipe.json and transformer/)")
    parser.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for more images")
    parser.add_argument("--steps", type=int, default=None, help="Euler steps (default: the recipe's)")
    parser.add_argument(
        "--cfg-scale", type=float, default=None, help="classifier-free guidance (default: the recipe's)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="PNG to write (default: <checkpoint>/samples/sample.png)")
    args = parser.parse_args(argv)
    run_dir = Path(args.checkpoint)
    if not (run_dir / "recipe.json").is_file() or not (run_dir / TRANSFORMER_FOLDER).is_dir():
        raise FileNotFoundError(
            f"{run_dir} is not a finished titanpod-diffusion run: it needs recipe.json and {TRANSFORMER_FOLDER}/."
        )
    recipe = DiffusionRecipe.load(run_dir / "recipe.json")
    model = dataclasses.replace(recipe.model, transformer_weights=str(run_dir / TRANSFORMER_FOLDER))
    models = build_diffusion_models(dataclasses.replace(recipe, model=model), torch.device("cpu"))
    config = SampleConfig(
        prompts=len(args.prompt),
        steps=args.steps or recipe.samples.steps,
        cfg_scale=recipe.samples.cfg_scale if args.cfg_scale is None else args.cfg_scale,
        seed=args.seed,
    )
    images = generate(models, args.prompt, recipe.data.resolution, config, recipe.model.guidance)
    out = save_image_grid(images, args.out or run_dir / "samples" / "sample.png", captions=args.prompt)
    console.print(f"wrote {out}", soft_wrap=True)
    return 0


def print_summary(console: Console, result: DiffusionResult) -> None:
    """What the run did and where it wrote."""
    losses = result.summary.losses
    window = min(10, len(losses))
    table = Table(title="titanpod-diffusion summary", show_header=False)
    table.add_row("parameters", f"{result.parameters:,}")
    table.add_row("steps", str(result.summary.steps_done) + (" (interrupted)" if result.summary.interrupted else ""))
    if losses:
        table.add_row(f"loss, first {window} steps (mean)", f"{sum(losses[:window]) / window:.4f}")
        table.add_row(f"loss, last {window} steps (mean)", f"{sum(losses[-window:]) / window:.4f}")
    table.add_row("samples/s (after step 1)", f"{result.samples_per_second:,.1f}")
    table.add_row("MFU", f"{result.summary.mfu:.1%}")
    table.add_row("wall time", f"{result.summary.wall_seconds:.1f} s")
    console.print(table)
    console.print(f"run directory: {result.run_dir}", soft_wrap=True)
    for path in result.samples:
        console.print(f"samples: {path}", soft_wrap=True)
    console.print(f"transformer: {result.transformer_path or 'not saved'}", soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``titanpod-diffusion``; returns the process exit code."""
    console = Console()
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["sample"]:
            return sample_command(argv[1:], console)
        parsed = parse_train(argv)
        if parsed is None:
            return 0
        recipe, action = parsed
        if action == "rehearse":
            from titanpod.recipes.rehearsal.diffusion import rehearse_diffusion

            rehearse_diffusion(recipe)
        if action == "dry_run":
            from titanpod.recipes.planner.flux import flux_plan_table, plan_flux
            from titanpod.recipes.planner.host_table import print_host
            from titanpod.recipes.planner.report import target_chip

            plan = plan_flux(recipe, target_chip(recipe.target.chip), recipe.target.chips, recipe.target.mfu)
            console.print(flux_plan_table(plan))
            print_host(console, recipe.name, plan.host)
            return 0 if plan.fits else 1
        result = run_diffusion(recipe, console)  # prints the recipe first; under torchrun rank 0 alone speaks
    except (KeyError, ValueError, RuntimeError, OSError) as error:
        print_error(error)
        return 2 if isinstance(error, (KeyError, ValueError)) else 1
    if result.is_main:
        print_summary(console, result)
    code = run_exit_code(result.summary)
    if result.processes > 1:
        exit_rank(code)  # once the run is written: see exit_rank
    return code


if __name__ == "__main__":
    sys.exit(main())
