"""One process of a rehearsal run: ``python -m titanpod.runs.rehearsal.worker RECIPE.json [pretrain|diffusion]``.

It trains the recipe file exactly as its runner trains any recipe (``run_pretraining`` by default,
``run_diffusion`` for a FLUX recipe); the rehearsal launches it under ``torch.distributed.run`` for the
torch executor, or alone with host devices for the xla lane. Rank 0 prints; the exit code says whether
the run finished.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from titanpod.device import process_info
from titanpod.recipes.errors import print_error
from titanpod.runs.process_exit import exit_rank, run_exit_code

RUNNERS = ("pretrain", "diffusion")
"""The runners a rehearsal run can train with (the worker's second argument; ``pretrain`` by default)."""


def train(recipe_file: Path, runner: str, console: Console | None) -> int:
    """Train ``recipe_file`` with ``runner``; the run's exit code."""
    if runner == "diffusion":
        from titanpod.recipes.diffusion.recipe import DiffusionRecipe
        from titanpod.runs.diffusion.run import run_diffusion

        return run_exit_code(run_diffusion(DiffusionRecipe.load(recipe_file), console).summary)
    from titanpod.recipes.recipe import Recipe
    from titanpod.runs.pretrain import run_pretraining

    return run_exit_code(run_pretraining(Recipe.load(recipe_file), console).summary)


def main(argv: list[str] | None = None) -> int:
    """Train the recipe file named by the first argument with the runner named by the second; 0 when every step
    ran."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or (args[1:] and args[1] not in RUNNERS):
        print_error(ValueError(f"usage: python -m titanpod.runs.rehearsal.worker RECIPE.json [{'|'.join(RUNNERS)}]"))
        return 2
    runner = args[1] if len(args) == 2 else RUNNERS[0]
    main_process = process_info().is_main
    try:
        return train(Path(args[0]), runner, Console(width=120) if main_process else None)
    except (KeyError, ValueError, RuntimeError, OSError) as error:
        print_error(error)
        return 1


if __name__ == "__main__":
    exit_rank(main())  # a gloo rank's interpreter teardown occasionally aborts after a finished run
