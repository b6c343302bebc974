"""``--rehearse`` as a command: where the rehearsal goes, its errors said to the user, and its exit status."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from titanpod.recipes.errors import print_error
from titanpod.runs.rehearsal.rehearse import RehearsalReport

Rehearse = Callable[[Any, Path, Console, "tuple[str, ...] | None"], RehearsalReport]
"""A rehearsal: (recipe, folder, console, lanes) -> its report (``rehearse`` or ``rehearse_diffusion``)."""


def rehearse_command(recipe: Any, lanes: tuple[str, ...] | None, console: Console, rehearse: Rehearse) -> int:
    """Rehearse ``recipe`` with ``rehearse`` in ``<output.runs_dir>/rehearse-<name>-<time>``: 0 when every lane's
    small run trained, learnt and resumed exactly, 1 when a check failed, 2 when a setting cannot be honoured (said
    before any run), 130 when interrupted."""
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
