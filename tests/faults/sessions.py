"""Opening a run session on a run directory as a trainer would, without building a model."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

from rich.console import Console

from titanpod.checkpoint import CheckpointConfig
from titanpod.device import get_backend
from titanpod.recipes import Recipe, get_recipe
from titanpod.runs.session import RunSession


def session_recipe(runs: Path, run_name: str = "run", checkpoint: CheckpointConfig | None = None, **output) -> Recipe:
    """The debug recipe writing to ``runs/run_name`` (no TensorBoard), with ``output`` fields and ``checkpoint``."""
    base = get_recipe("llama3_debug")
    fields = {"runs_dir": str(runs), "run_name": run_name, "tensorboard": False, **output}
    return dataclasses.replace(
        base, output=dataclasses.replace(base.output, **fields), checkpoint=checkpoint or CheckpointConfig()
    )


def open_session(recipe: Recipe) -> tuple[RunSession, io.StringIO]:
    """A session of ``recipe`` on the cpu lane, and what it says (its console's text)."""
    said = io.StringIO()
    return RunSession(recipe, get_backend("cpu"), Console(file=said, width=400)), said
