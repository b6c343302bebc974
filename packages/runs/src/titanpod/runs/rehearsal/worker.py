"""One process of a rehearsal run: ``python -m titanpod.runs.rehearsal.worker RECIPE.json``.

It trains the recipe file exactly as ``run_pretraining`` trains any recipe (the rehearsal
launches it under ``torch.distributed.run`` for the torch executor, or alone with host
devices for the xla lane). Rank 0 prints; the exit code says whether the run finished.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from titanpod.device import process_info
from titanpod.recipes.errors import print_error
from titanpod.recipes.recipe import Recipe
from titanpod.runs.pretrain import run_pretraining
from titanpod.runs.process_exit import exit_rank, run_exit_code


def main(argv: list[str] | None = None) -> int:
    """Train the recipe file named by the only argument; 0 when every step ran."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print_error(ValueError("usage: python -m titanpod.runs.rehearsal.worker RECIPE.json"))
        return 2
    recipe = Recipe.load(Path(args[0]))
    main_process = process_info().is_main
    try:
        result = run_pretraining(recipe, Console(width=120) if main_process else None)
    except (KeyError, ValueError, RuntimeError, OSError) as error:
        print_error(error)
        return 1
    return run_exit_code(result.summary)


if __name__ == "__main__":
    exit_rank(main())  # a gloo rank's interpreter teardown occasionally aborts after a finished run
