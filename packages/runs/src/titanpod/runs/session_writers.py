"""A session's metrics writers: ``metrics.jsonl``, TensorBoard, W&B, and the loss plot drawn from them.

Rank 0 writes ``metrics.jsonl``, ``tensorboard/`` with ``output.tensorboard`` and the W&B run with
``output.wandb`` (``titanpod.runs.wandb_run``); ``loss.png`` is drawn from ``metrics.jsonl`` at the end. Other
ranks hold no writers, so every method may be called on every rank.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

from titanpod.graph import JsonlWriter, StepMetrics, TensorBoardWriter, TrainSummary
from titanpod.graph.metrics_rows import set_aside_unreadable
from titanpod.graph.tracking import WandbWriter, final_figures
from titanpod.recipes.recipe import RunRecipe
from titanpod.runs.every_rank import raise_on_every_rank
from titanpod.runs.loss_plot import LOSS_PLOT_FILE, write_loss_plot
from titanpod.runs.wandb_run import WandbStartError, open_wandb

METRICS_FILE, TENSORBOARD_FOLDER = "metrics.jsonl", "tensorboard"


class RunWriters:
    """Where a run's reports, figures and images go (rank 0; nothing on other ranks)."""

    def __init__(self, run_dir: Path, title: str, is_main: bool, quiet: bool, say: Callable[[str], None]) -> None:
        """No writer yet: ``open`` adds them. ``title`` heads the loss plot; ``quiet`` (no console on rank 0)
        turns a plot that cannot be drawn into a warning as well."""
        self.run_dir = run_dir
        self.title = title
        self.is_main = is_main
        self.quiet = quiet
        self.say = say
        self.all: list[JsonlWriter | TensorBoardWriter | WandbWriter] = []
        """The metrics writers (rank 0 only): ``metrics.jsonl``, ``tensorboard/`` with ``output.tensorboard``,
        and a W&B run with ``output.wandb``."""
        self.trackers: list[TensorBoardWriter | WandbWriter] = []
        """The writers that also take the recipe, images and the final figures (TensorBoard, W&B)."""

    def open(self, recipe: RunRecipe) -> None:
        """Open the writers ``recipe.output`` asks for (every rank calls it). The W&B run starts first: when it
        cannot and ``output.wandb_required`` is on, every rank raises before any file is written. A
        ``metrics.jsonl`` that cannot be read back is moved aside and a new one started."""
        wandb = self._open_wandb(recipe) if recipe.output.wandb else None  # first: it may stop the run
        if self.is_main:
            metrics = self.run_dir / METRICS_FILE
            if (damaged := set_aside_unreadable(metrics)) is not None:
                self.say(
                    f"[yellow]{metrics} cannot be read back ({damaged[1]}): moved to "
                    f"{damaged[0].name}, and this run starts a new {METRICS_FILE}[/]"
                )
            self.all.append(JsonlWriter(metrics))
            if recipe.output.tensorboard:
                board = TensorBoardWriter(self.run_dir / TENSORBOARD_FOLDER)
                board.write_config(recipe.to_dict())
                self.trackers.append(board)
            if wandb is not None:
                self.trackers.append(wandb)
        self.all.extend(self.trackers)

    def _open_wandb(self, recipe: RunRecipe) -> WandbWriter | None:
        """Rank 0 starts or continues the run's W&B run (``titanpod.runs.wandb_run``); ``None`` elsewhere, when
        W&B is off or when it cannot start. When it cannot start and ``output.wandb_required`` is on, every rank
        raises, before any work."""
        wandb, problem = None, None
        if self.is_main:
            try:
                wandb = open_wandb(recipe.output, self.run_dir, recipe.to_dict(), self.say)
            except (WandbStartError, ValueError) as error:
                problem = error
        raise_on_every_rank(problem)
        return wandb

    def write_report(self, report: StepMetrics) -> None:
        """Append a training report to every writer."""
        for writer in self.all:
            writer.write(report)

    def write_scalars(self, step_number: int, values: dict[str, float]) -> None:
        """Append named figures at ``step_number`` to every writer."""
        for writer in self.all:
            writer.write_scalars(step_number, values)

    def write_image(self, step_number: int, name: str, path: Path) -> None:
        """Add the PNG file at ``path`` as image ``name`` at ``step_number`` to TensorBoard and W&B."""
        for tracker in self.trackers:
            tracker.write_image(step_number, name, path)

    def write_summary(self, summary: TrainSummary) -> None:
        """Hand the run's final figures to TensorBoard (as the hyper-parameters' metrics) and W&B (as the run's
        summary)."""
        for tracker in self.trackers:
            tracker.write_summary(final_figures(summary))

    def set_aside_after(self, start_step: int) -> None:
        """Move the rows of ``metrics.jsonl`` past ``start_step`` (an earlier attempt went on past its last
        checkpoint) to a file beside it, so the file keeps one row per step."""
        for writer in self.all:
            if isinstance(writer, JsonlWriter) and (aside := writer.set_aside_after(start_step)) is not None:
                self.say(
                    f"{METRICS_FILE}: the rows after step {start_step}, from an attempt that went past its last "
                    f"checkpoint, are now in {aside.name}"
                )

    def draw_loss_plot(self) -> Path | None:
        """Rank 0: draw ``loss.png`` from ``metrics.jsonl`` (as ``RunSession.draw_loss_plot`` says). Returns its
        path; ``None`` on other ranks, before any report, and when it cannot be drawn, which is a warning and
        never a failed run."""
        if not self.is_main:
            return None
        try:
            path = write_loss_plot(self.run_dir, self.title, METRICS_FILE)
        except Exception as error:  # a picture never costs a run
            message = f"could not draw {LOSS_PLOT_FILE}: {type(error).__name__}: {error}"
            if self.quiet:
                warnings.warn(message, RuntimeWarning, stacklevel=3)  # at the caller of RunSession.draw_loss_plot
            self.say(f"[yellow]{message}[/]")
            return None
        if path is not None:
            self.say(f"loss curve: {path}")
        return path

    def close(self) -> None:
        """Close every writer; a second call does nothing."""
        for writer in self.all:
            writer.close()
        self.all = []
