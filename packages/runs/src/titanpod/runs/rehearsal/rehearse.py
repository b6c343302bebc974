"""``--rehearse``: run a pod recipe on this machine with everything it sets, at a small size, and check it.

On each lane the scaled recipe runs three times: an uninterrupted run of ``STEPS`` steps;
a second run that stops at ``STOP_AT`` with a checkpoint; and that run resumed to the end.
The rehearsal passes when every loss is finite, the loss falls, the resumed steps' losses
equal the uninterrupted run's and both end with the same weights. A recipe with pipeline stages
runs a fourth time without them (pp 1 on 1/pp of the processes: the same data ranks and batch),
and its losses must equal the pipelined run's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from titanpod.data.shipped import builtin_tokenizer_path
from titanpod.graph.metrics_rows import read_rows
from titanpod.recipes.recipe import Recipe
from titanpod.recipes.rehearsal.corpus import write_hub_layout
from titanpod.recipes.rehearsal.scaling import (
    REHEARSAL_LANES,
    STEPS,
    STOP_AT,
    Setting,
    check_honourable,
    rehearsal_lanes,
    scale_recipe,
)
from titanpod.runs.rehearsal.launch import Launch, launch_command, launch_environment, run_logged

RESUME_TOLERANCE = 1e-5
"""Largest relative difference allowed between a resumed step's loss and the uninterrupted run's."""
WEIGHTS_TOLERANCE = 1e-5
"""Largest difference allowed between the final weights of the resumed and the uninterrupted run."""
LAYOUT_TOLERANCE = 1e-5
"""Largest relative difference allowed between a pipelined run's losses and the same recipe's without stages."""


@dataclass
class LaneResult:
    """What the rehearsal found on one lane."""

    lane: str
    """``cpu`` (torch executor) or ``xla``."""
    losses: list[float] = field(default_factory=list)
    """The uninterrupted run's loss at every step."""
    resumed_losses: list[float] = field(default_factory=list)
    """The stopped-then-resumed run's loss at every step (its first run, then the resumed one)."""
    resume_difference: float = math.inf
    """Largest relative difference between the two runs' losses at the resumed steps."""
    weights_difference: float = math.inf
    """Largest absolute difference between the two runs' final weights."""
    without_pp_difference: float | None = None
    """With pipeline stages: largest relative difference between the uninterrupted run's losses and the same
    recipe's without stages; ``None`` for a recipe without them."""
    dropped_tokens: int | None = None
    """Mixture-of-experts models: routed choices dropped over the uninterrupted run (past an expert's capacity)."""
    seconds: float = 0.0
    """Wall time of the lane's three runs."""
    problems: list[str] = field(default_factory=list)
    """Why the lane failed; empty when it passed."""

    @property
    def passed(self) -> bool:
        """Whether every check held."""
        return not self.problems


@dataclass
class RehearsalReport:
    """A whole rehearsal: the settings table and each lane's result."""

    recipe: str
    """The recipe rehearsed."""
    folder: Path
    """Where its runs, logs and ``rehearsal.json`` are."""
    settings: dict[str, list[Setting]]
    """Lane -> the table rows of that lane's scaled recipe."""
    lanes: list[LaneResult]
    """Each lane's result."""

    @property
    def passed(self) -> bool:
        """Whether every lane passed."""
        return bool(self.lanes) and all(lane.passed for lane in self.lanes)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (written to ``rehearsal.json``)."""
        return {
            "recipe": self.recipe,
            "passed": self.passed,
            "settings": {lane: [dataclasses.asdict(row) for row in rows] for lane, rows in self.settings.items()},
            "lanes": [{**dataclasses.asdict(lane), "passed": lane.passed} for lane in self.lanes],
        }


def read_reports(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Step -> training report from a run's ``metrics.jsonl`` (validation lines skipped; a later line wins)."""
    return {
        int(record["step"]): record
        for record in read_rows(run_dir / "metrics.jsonl")
        if "loss" in record and "step" in record
    }


def read_losses(run_dir: Path) -> dict[int, float]:
    """Step -> training loss from a run's ``metrics.jsonl``."""
    return {step: float(report["loss"]) for step, report in read_reports(run_dir).items()}


def total_dropped(run_dir: Path) -> int | None:
    """Routed choices dropped over a run (``dropped_tokens`` summed over its reports); ``None`` for a dense model."""
    counts = [report.get("dropped_tokens") for report in read_reports(run_dir).values()]
    counts = [count for count in counts if count is not None]
    return int(sum(counts)) if counts else None


def weights_difference(first: Path, second: Path) -> float:
    """Largest absolute difference between two ``model.safetensors`` files of the same tensors."""
    from safetensors.torch import load_file

    a, b = load_file(first), load_file(second)
    if set(a) != set(b):
        raise ValueError(f"{first} and {second} hold different tensors.")
    return max(float((a[name].double() - b[name].double()).abs().max()) for name in a)


def judge(
    result: LaneResult, reference: dict[int, float], resumed: dict[int, float], weights: tuple[Path, Path]
) -> None:
    """Fill ``result``'s losses and differences from the two runs and name every check that failed."""
    steps = list(range(1, STEPS + 1))
    result.losses = [reference.get(step, math.nan) for step in steps]
    result.resumed_losses = [resumed.get(step, math.nan) for step in steps]
    missing = [step for step in steps if step not in reference or step not in resumed]
    if missing:
        result.problems.append(f"no loss recorded at steps {missing}")
        return
    every = result.losses + result.resumed_losses
    if not all(math.isfinite(loss) for loss in every):
        result.problems.append("a loss is not finite")
    if not result.losses[-1] < result.losses[0]:
        result.problems.append(f"the loss did not fall ({result.losses[0]:.4f} -> {result.losses[-1]:.4f})")
    after = range(STOP_AT, STEPS)
    result.resume_difference = max(
        abs(result.resumed_losses[i] - result.losses[i]) / max(abs(result.losses[i]), 1e-12) for i in after
    )
    if not result.resume_difference <= RESUME_TOLERANCE:
        result.problems.append(
            f"the resumed steps' losses differ from the uninterrupted run's by {result.resume_difference:.2e} "
            f"(relative; allowed {RESUME_TOLERANCE:.0e})"
        )
    if all(path.is_file() for path in weights):
        result.weights_difference = weights_difference(*weights)
        if not result.weights_difference <= WEIGHTS_TOLERANCE:
            result.problems.append(f"the final weights differ by {result.weights_difference:.2e}")
    elif not result.problems:
        result.problems.append("a run wrote no final weights")


def without_pipeline(recipe: Recipe) -> Recipe:
    """``recipe`` with its pipeline stages taken away and every other degree kept: run on 1/pp of the processes,
    it has the same data ranks, so the same batch a step (``data.batch_size`` x ``train.grad_accum_steps``)."""
    parallel = dataclasses.replace(recipe.parallel, pp=1, pp_microbatches=0, pp_stages_per_rank=0, pp_recompute=False)
    return dataclasses.replace(recipe, parallel=dataclasses.replace(parallel, pp_schedule="1f1b"))


def judge_without_pp(result: LaneResult, reference: dict[int, float], without_pp: dict[int, float]) -> None:
    """Compare the pipelined run's losses with the same recipe's without stages; name a failed check."""
    steps = list(range(1, STEPS + 1))
    if any(step not in without_pp for step in steps):
        result.problems.append("the run without pipeline stages recorded no loss at some step")
        return
    result.without_pp_difference = max(
        abs(reference[step] - without_pp[step]) / max(abs(without_pp[step]), 1e-12) for step in steps
    )
    if not result.without_pp_difference <= LAYOUT_TOLERANCE:
        result.problems.append(
            f"the pipelined losses differ from the same recipe's without pipeline stages by "
            f"{result.without_pp_difference:.2e} (relative; allowed {LAYOUT_TOLERANCE:.0e})"
        )


def _describe_failure(name: str, launch: Launch) -> str:
    return f"the {name} run exited with status {launch.returncode}; its last lines:\n{launch.tail()}"


FINAL_WEIGHTS = {
    "pretrain": "model/model.safetensors",
    "diffusion": "transformer/diffusion_pytorch_model.safetensors",
}
"""Runner -> where in a run directory it writes the final weights the rehearsal compares."""


def rehearse_lane(recipe: Any, lane: str, folder: Path, say: Any, runner: str = "pretrain") -> LaneResult:
    """Run the scaled ``recipe`` on ``lane`` three times (uninterrupted, stopped, resumed) with ``runner``
    (``pretrain`` or ``diffusion``, see ``FINAL_WEIGHTS``) and judge it."""
    result = LaneResult(lane)
    runs = folder / lane
    runs.mkdir(parents=True, exist_ok=True)
    env = launch_environment(lane)
    plan = [
        ("uninterrupted", "uninterrupted", recipe.train, f"{STEPS} steps"),
        (
            "stopped",
            "resumed",
            dataclasses.replace(recipe.train, stop_at_step=STOP_AT),
            f"steps 1-{STOP_AT}, then stop",
        ),
        ("resumed", "resumed", recipe.train, f"resume, steps {STOP_AT + 1}-{STEPS}"),
    ]
    pp = recipe.parallel.pp
    if pp > 1:
        plan.append(("without_pp", "without_pp", recipe.train, f"{STEPS} steps without pipeline stages"))
    start = time.monotonic()
    for name, run_name, train, what in plan:
        base = without_pipeline(recipe) if name == "without_pp" else recipe
        run = dataclasses.replace(
            base,
            train=train,
            output=dataclasses.replace(recipe.output, runs_dir=str(runs), run_name=run_name),
        )
        recipe_file = runs / f"{name}.recipe.json"
        recipe_file.write_text(run.to_json(), encoding="utf-8")
        say(f"[{lane}] {name} run ({what}) ...")
        processes = REHEARSAL_LANES[lane].processes // pp if name == "without_pp" else None
        command = launch_command(lane, recipe_file, processes, runner)
        launch = run_logged(command, env, runs / f"{name}.log", folder)
        say(f"[{lane}] {name} run: exit {launch.returncode} after {launch.seconds:.0f} s (log: {launch.log})")
        if launch.returncode != 0:
            result.problems.append(_describe_failure(name, launch))
            result.seconds = time.monotonic() - start
            return result
    result.seconds = time.monotonic() - start
    reference, resumed = runs / "uninterrupted", runs / "resumed"
    checkpoint = resumed / "checkpoints" / f"step-{STOP_AT:06d}"
    if not checkpoint.is_dir():
        result.problems.append(f"the stopped run left no checkpoint at {checkpoint}")
    weights = (reference / FINAL_WEIGHTS[runner], resumed / FINAL_WEIGHTS[runner])
    judge(result, read_losses(reference), read_losses(resumed), weights)
    if pp > 1:
        judge_without_pp(result, read_losses(reference), read_losses(runs / "without_pp"))
    result.dropped_tokens = total_dropped(reference)
    return result


def rehearse(recipe: Recipe, folder: Path, console: Console, lanes: tuple[str, ...] | None = None) -> RehearsalReport:
    """Rehearse ``recipe`` in ``folder`` on ``lanes`` (default: ``rehearsal_lanes``) and print what happened.

    ``RehearsalError`` (before anything runs) names a setting this machine cannot honour.
    """
    lanes = lanes or rehearsal_lanes(recipe)
    check_honourable(recipe, lanes)
    folder = folder.resolve()  # the runs start in this folder: a path relative to ours would not be found there
    folder.mkdir(parents=True, exist_ok=True)
    data_dir = folder / "dataset"
    if recipe.data.source == "hub":
        write_hub_layout(data_dir, recipe.data.name, recipe.data.split, recipe.data.validation_split)
    scaled = {lane: scale_recipe(recipe, lane, folder / lane, data_dir, builtin_tokenizer_path()) for lane in lanes}
    return run_rehearsal(recipe.name, scaled, folder, console)


def run_rehearsal(
    name: str,
    scaled: dict[str, tuple[Any, list[Setting]]],
    folder: Path,
    console: Console,
    runner: str = "pretrain",
) -> RehearsalReport:
    """Rehearse recipe ``name`` in ``folder``: on each lane of ``scaled`` (lane -> the recipe scaled for it and
    its table rows) run it with ``runner`` (see ``rehearse_lane``), then write ``rehearsal.json`` and print it."""
    settings = {lane: rows for lane, (_, rows) in scaled.items()}
    lanes = list(scaled)

    def say(message: str) -> None:
        console.print(message, soft_wrap=True, highlight=False, markup=False)

    say(f"rehearsing {name} on the {' and '.join(lanes)} lane{'s' if len(lanes) > 1 else ''} in {folder}")
    results = [rehearse_lane(scaled[lane][0], lane, folder, say, runner) for lane in lanes]
    report = RehearsalReport(name, folder, settings, results)
    (folder / "rehearsal.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    print_report(report, console)
    return report


def settings_table(report: RehearsalReport) -> Table:
    """One row per recipe setting: the recipe's value, the rehearsal's (per lane where they differ), whether it ran."""
    table = Table(title=f"rehearsal of {report.recipe}: settings")
    table.add_column("setting")
    table.add_column("recipe")
    table.add_column("rehearsal")
    table.add_column("ran")
    by_lane = {result.lane: result for result in report.lanes}
    lanes = list(report.settings)
    first = report.settings[lanes[0]]
    for index, row in enumerate(first):
        values = {lane: report.settings[lane][index].rehearsal for lane in lanes}
        if len(set(values.values())) == 1:
            shown = row.rehearsal
        else:
            shown = "; ".join(f"{lane}: {value}" for lane, value in values.items())
        ran = [lane for lane in lanes if by_lane[lane].passed]
        table.add_row(row.name, row.recipe, shown if shown != row.recipe else "same", ", ".join(ran) or "no")
    return table


def results_table(report: RehearsalReport) -> Table:
    """One row per lane: the losses, the resume and weights checks, the time and the verdict."""
    table = Table(title=f"rehearsal of {report.recipe}: results")
    moe = any(lane.dropped_tokens is not None for lane in report.lanes)
    columns = ["lane", "losses (uninterrupted)", "resumed vs uninterrupted", "final weights"]
    columns += ["dropped tokens", "time", "verdict"] if moe else ["time", "verdict"]
    for column in columns:
        table.add_column(column)
    for lane in report.lanes:
        losses = " ".join(f"{loss:.4f}" for loss in lane.losses) or "-"
        resumed = f"max rel. diff {lane.resume_difference:.1e}" if math.isfinite(lane.resume_difference) else "-"
        weights = f"max diff {lane.weights_difference:.1e}" if math.isfinite(lane.weights_difference) else "-"
        if lane.without_pp_difference is not None:
            weights += f"; without pp: losses max rel. diff {lane.without_pp_difference:.1e}"
        verdict = "[green]pass[/]" if lane.passed else "[red]FAIL[/]"
        dropped = [] if not moe else [f"{lane.dropped_tokens:,}" if lane.dropped_tokens is not None else "-"]
        table.add_row(lane.lane, losses, resumed, weights, *dropped, f"{lane.seconds:.0f} s", verdict)
    return table


def print_report(report: RehearsalReport, console: Console) -> None:
    """The settings table, the results table and every problem found."""
    console.print(settings_table(report))
    console.print(results_table(report))
    for lane in report.lanes:
        for problem in lane.problems:
            console.print(f"[bold red]{lane.lane}:[/] {problem}", soft_wrap=True, highlight=False)
    verdict = "passed" if report.passed else "failed"
    console.print(f"rehearsal {verdict}: {report.folder / 'rehearsal.json'}", soft_wrap=True)
