"""Experiment tracking beyond the metrics files: Weights & Biases, and what every tracker is handed at a run's
start (the recipe) and end (the final figures)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Protocol

from titanpod.graph.loop import TrainSummary

WANDB_EXTRA = "pip install 'titanpod-graph[wandb]'"
"""How to install what ``output.wandb`` needs."""


class LoggedRecord(Protocol):
    """A metrics report: its step and its figures (``StepMetrics``, or a post-training step's)."""

    step: int

    def logged(self) -> dict[str, Any]:
        """The figures that apply, by name."""
        ...


def final_figures(summary: TrainSummary) -> dict[str, float]:
    """A finished run's figures for trackers' summaries: ``final_loss`` (the last report's mean loss; without
    reports, the last step's finite loss),
    ``steps_done``, ``tokens_per_second`` and ``mfu`` (whole run after the first step), ``wall_seconds``,
    ``skipped_steps``, and ``peak_memory_gib`` where the device reports it."""
    figures: dict[str, float] = {
        "steps_done": summary.steps_done,
        "tokens_per_second": summary.tokens_per_second,
        "mfu": summary.mfu,
        "wall_seconds": summary.wall_seconds,
        "skipped_steps": len(summary.skipped_steps),
    }
    finite = [loss for loss in summary.losses if math.isfinite(loss)]
    if summary.reports:
        figures["final_loss"] = summary.reports[-1].loss
    elif finite:
        figures["final_loss"] = finite[-1]
    if summary.peak_memory_gib is not None:
        figures["peak_memory_gib"] = summary.peak_memory_gib
    return figures


class TrackerStartError(RuntimeError):
    """A tracker's run could not start (W&B: no login, no network); the message is the tracker's own first line."""


class WandbWriter:
    """Logs a run to Weights & Biases: the recipe as the run's config, every report under ``train/``, other
    figures under ``eval/``, images, and the final figures as the run's summary.

    ``mode="offline"`` needs no network: the run is kept under ``<folder>/wandb/offline-run-*`` for
    ``wandb sync``. Only rank 0 makes one.
    """

    def __init__(
        self,
        project: str,
        mode: Literal["online", "offline"],
        folder: Path,
        name: str,
        config: dict[str, Any],
        *,
        entity: str | None = None,
        run_id: str | None = None,
        resume: str | None = None,
    ) -> None:
        """Start a W&B run named ``name`` in ``project`` (of ``entity``; ``None``: W&B's default), its files under
        ``folder``. ``run_id`` with ``resume="allow"`` continues that W&B run when it exists (``None``: a new id).

        ``ImportError`` says how to install W&B when it is missing; ``TrackerStartError`` carries W&B's reason
        when the run cannot start (no login, the server out of reach)."""
        try:
            import wandb
        except ImportError as error:
            raise ImportError(
                f"--output.wandb needs Weights & Biases, which is not installed: {WANDB_EXTRA} "
                "(or leave --output.wandb unset)."
            ) from error
        folder.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        try:
            self._run = wandb.init(
                project=project,
                entity=entity,
                name=name,
                id=run_id,
                resume=resume,
                config=config,
                mode=mode,
                dir=str(folder),
                settings=wandb.Settings(console="off"),  # the run's console stays the run's own
            )
        except wandb.errors.Error as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise TrackerStartError(reason) from error
        self.run_dir = Path(self._run.dir).parent
        """This W&B run's folder (``<folder>/wandb/<run>``)."""
        self.run_id: str = self._run.id
        """The W&B run's id (what ``run_id`` takes to continue it)."""

    def write(self, record: LoggedRecord) -> None:
        """Log every figure of ``record`` but ``step`` as ``train/<name>`` at ``record.step`` (words, such as
        ``mfu_peak``, are not figures)."""
        logged = record.logged().items()
        values = {f"train/{name}": value for name, value in logged if name != "step" and isinstance(value, int | float)}
        self._run.log(values, step=record.step)

    def write_scalars(self, step: int, values: dict[str, float]) -> None:
        """Log ``values`` as ``eval/<name>`` at ``step`` (a validation loss, an accuracy)."""
        self._run.log({f"eval/{name}": value for name, value in values.items()}, step=step)

    def write_image(self, step: int, name: str, path: Path) -> None:
        """Log the image file at ``path`` (a sample grid) as ``name`` at ``step``."""
        self._run.log({name: self._wandb.Image(str(path), caption=path.name)}, step=step)

    def write_summary(self, figures: dict[str, float]) -> None:
        """Set the run's summary figures (``final_figures``)."""
        self._run.summary.update(figures)

    def close(self) -> None:
        """Finish the run (an offline run's files are complete after this)."""
        self._run.finish()
