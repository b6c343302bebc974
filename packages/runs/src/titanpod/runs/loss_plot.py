"""A run's loss curve as ``loss.png``: the training loss of every report, the validation loss where the run
validated, and the learning rate, read back from the run's ``metrics.jsonl``.

matplotlib is imported only when a plot is drawn, and without pyplot: drawing changes no global state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from titanpod.graph.metrics_rows import read_rows

LOSS_PLOT_FILE = "loss.png"
"""The loss curve's file name in a run directory."""
MARKERS_UP_TO = 60
"""Curves with at most this many points mark each one (a short run's few reports stay visible)."""


@dataclass
class LossHistory:
    """A run's losses and learning rate by optimizer step, as its ``metrics.jsonl`` records them."""

    steps: list[int] = field(default_factory=list)
    """The step of every training report, increasing."""
    losses: list[float] = field(default_factory=list)
    """Mean training loss of each report (over the steps since the previous one)."""
    lrs: list[float] = field(default_factory=list)
    """Learning rate at each report's step."""
    validation_steps: list[int] = field(default_factory=list)
    """Steps the run measured its validation loss at, increasing."""
    validation_losses: list[float] = field(default_factory=list)
    """Validation loss at each of ``validation_steps``."""


def read_loss_history(metrics_path: Path) -> LossHistory:
    """The loss history in ``metrics_path`` (a run's ``metrics.jsonl``): training reports (lines with ``loss``)
    and validation losses (lines with ``validation_loss``); other lines are skipped.

    A resumed run appends to the file: a report at or before a step already recorded means the run went back to
    a checkpoint, so the earlier history from that step on is dropped and the history is the one the run's
    weights followed. A line cut short (a run killed while writing) is skipped; a NaN or Inf figure (written as
    ``null``, named under ``nonfinite``) reads back as itself, and a figure missing or ``null`` as NaN.
    """
    train: dict[int, tuple[float, float]] = {}
    validation: dict[int, float] = {}
    for record in read_rows(metrics_path):
        if "step" not in record:
            continue
        step = int(record["step"])
        if "loss" in record:
            if train and step <= max(train):  # went back to a checkpoint: what came after it is replaced
                train = {kept: values for kept, values in train.items() if kept < step}
                validation = {kept: loss for kept, loss in validation.items() if kept < step}
            train[step] = (_figure(record.get("loss")), _figure(record.get("lr")))
        if "validation_loss" in record:
            validation[step] = _figure(record["validation_loss"])
    history = LossHistory()
    for step in sorted(train):
        history.steps.append(step)
        history.losses.append(train[step][0])
        history.lrs.append(train[step][1])
    history.validation_steps = sorted(validation)
    history.validation_losses = [validation[step] for step in history.validation_steps]
    return history


def _figure(value: float | None) -> float:
    """A figure of a row as a float: NaN for one missing or ``null``."""
    return float("nan") if value is None else float(value)


def draw_loss_plot(history: LossHistory, path: Path, title: str) -> Path:
    """Draw ``history`` as a PNG at ``path`` titled ``title``: training and validation loss above, the
    learning rate below, against the optimizer step. Returns ``path``."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not history.steps:
        raise ValueError(f"No training reports to draw for {title!r}: the run has not reported a step yet.")
    figure = Figure(figsize=(8, 5.5), dpi=100, layout="constrained")
    loss_axes, lr_axes = figure.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    marker = "o" if len(history.steps) <= MARKERS_UP_TO else None
    loss_axes.plot(history.steps, history.losses, marker=marker, markersize=3, color="tab:blue", label="training loss")
    if history.validation_steps:
        loss_axes.plot(
            history.validation_steps,
            history.validation_losses,
            marker="o",
            color="tab:orange",
            label="validation loss",
        )
    loss_axes.set_ylabel("loss")
    loss_axes.grid(alpha=0.3)
    loss_axes.legend(loc="upper right")
    lr_axes.plot(history.steps, history.lrs, marker=marker, markersize=3, color="tab:green")
    lr_axes.set_ylabel("learning rate")
    lr_axes.set_xlabel("optimizer step")
    lr_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    lr_axes.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    lr_axes.grid(alpha=0.3)
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    drawn = path.with_name(f".{path.name}.drawing")
    figure.savefig(drawn, format="png")
    os.replace(drawn, path)  # replaces a link there rather than writing through it
    return path


def write_loss_plot(run_dir: Path, title: str, metrics_file: str = "metrics.jsonl") -> Path | None:
    """Draw ``run_dir``'s ``metrics_file`` as ``run_dir/loss.png`` titled ``title``; the path, or ``None`` when
    the run has no training report to draw."""
    if not (run_dir / metrics_file).is_file():
        return None
    history = read_loss_history(run_dir / metrics_file)
    if not history.steps:
        return None
    return draw_loss_plot(history, run_dir / LOSS_PLOT_FILE, title)
