"""A GRPO run's curves as ``rewards.png``: each step's mean reward and the share of its rollouts that were right,
with the held-out greedy accuracy before and after, read back from the run's ``metrics.jsonl`` and ``eval.json``.

matplotlib is imported only when a plot is drawn, and without pyplot: drawing changes no global state.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from titanpod.graph.metrics_rows import read_rows

REWARD_PLOT_FILE = "rewards.png"
"""The reward curves' file name in a GRPO run directory."""


def step_rows(metrics_path: Path) -> list[dict]:
    """The GRPO step rows of ``metrics_path`` in step order, as the run's weights followed them: a resumed run
    rewrites the steps after its checkpoint, and the later row of a step wins."""
    rows: dict[int, dict] = {}
    for row in read_rows(metrics_path):
        if "reward_mean" in row and "step" in row:
            step = int(row["step"])
            rows = {kept: value for kept, value in rows.items() if kept < step}
            rows[step] = row
    return [rows[step] for step in sorted(rows)]


def draw_reward_plot(run_dir: Path, title: str) -> Path | None:
    """Draw ``run_dir``'s rewards and accuracies as ``run_dir/rewards.png`` titled ``title``: the mean reward and
    the rollouts' accuracy of every step, and the held-out greedy accuracy of ``eval.json`` at the steps it was
    measured. The path, or ``None`` when the run has no step to draw."""
    rows = step_rows(run_dir / "metrics.jsonl")
    if not rows:
        return None
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    steps = [row["step"] for row in rows]
    figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    axes = figure.subplots()
    axes.plot(steps, [row["reward_mean"] for row in rows], marker="o", markersize=3, label="mean reward (rollouts)")
    axes.plot(steps, [row["accuracy"] for row in rows], marker="o", markersize=3, label="accuracy (rollouts)")
    evaluated = run_dir / "eval.json"
    scores = json.loads(evaluated.read_text(encoding="utf-8")) if evaluated.is_file() else {}
    points = [(scores[label]["step"], scores[label]["accuracy"]) for label in ("before", "after") if label in scores]
    if points:
        axes.plot(*zip(*points, strict=True), marker="s", linestyle="--", color="tab:red",
                  label="held-out accuracy (greedy)")  # fmt: skip
    axes.set_xlabel("GRPO step")
    axes.set_ylim(-0.02, 1.02)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    figure.suptitle(title)
    path = run_dir / REWARD_PLOT_FILE
    drawn = path.with_name(f".{path.name}.drawing")
    figure.savefig(drawn, format="png")
    os.replace(drawn, path)
    return path
