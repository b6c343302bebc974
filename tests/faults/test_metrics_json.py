"""metrics.jsonl is strict JSON: a NaN or Inf figure is written as null with the field named, and read back."""

from __future__ import annotations

import json
import math

import pytest

from tests.cli_runs import run_cli
from titanpod.graph import JsonlWriter, StepMetrics
from titanpod.graph.metrics_rows import read_row, read_rows
from titanpod.runs.loss_plot import read_loss_history
from titanpod.runs.trainer_export import loss_at


def strict(line: str) -> dict:
    """``line`` parsed as strict JSON: ``NaN``, ``Infinity`` and ``-Infinity`` are refused."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


def report(step: int, loss: float, grad_norm: float) -> StepMetrics:
    return StepMetrics(step, loss, grad_norm, 1e-3, 10.0, 0.1, 0.01, None, 1.0)


def test_a_nan_loss_is_written_as_null_and_named(tmp_path):
    writer = JsonlWriter(tmp_path / "metrics.jsonl")
    writer.write(report(1, 2.5, 1.0))
    writer.write(report(2, math.nan, math.inf))
    writer.write_scalars(2, {"validation_loss": -math.inf})
    writer.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    rows = [strict(line) for line in lines]
    assert "nonfinite" not in rows[0]
    assert rows[1]["loss"] is None and rows[1]["grad_norm"] is None
    assert rows[1]["nonfinite"] == {"loss": "nan", "grad_norm": "inf"}
    assert rows[2] == {"step": 2, "validation_loss": None, "nonfinite": {"validation_loss": "-inf"}}
    back = read_row(lines[1])
    assert back is not None and "nonfinite" not in back
    assert math.isnan(back["loss"]) and back["grad_norm"] == math.inf


def test_the_readers_take_the_nulls_back_as_the_figures_they_were(tmp_path):
    writer = JsonlWriter(tmp_path / "metrics.jsonl")
    writer.write(report(1, 2.5, 1.0))
    writer.write(report(2, math.nan, math.nan))
    writer.close()
    history = read_loss_history(tmp_path / "metrics.jsonl")
    assert history.steps == [1, 2] and history.losses[0] == 2.5 and math.isnan(history.losses[1])
    assert math.isnan(loss_at(tmp_path, 2)) and loss_at(tmp_path, 1) == 2.5


def test_a_line_cut_short_and_an_older_bare_nan_both_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": NaN}\n{"step": 2, "lo', encoding="utf-8")
    rows = read_rows(path)
    assert len(rows) == 1 and math.isnan(rows[0]["loss"])


@pytest.mark.slow
def test_a_run_whose_learning_rate_blows_up_writes_strict_json(tmp_path):
    args = ["--train.steps", "3", "--train.warmup-steps", "0", "--train.log-every", "1", "--train.lr", "1e30",
            "--data.seq-len", "32", "--data.batch-size", "2", "--output.run-name", "blown",
            "--output.no-tensorboard"]  # fmt: skip
    done = run_cli("titanpod.pretrain.cli", args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "runs" / "blown" / "metrics.jsonl").read_text().splitlines()
    rows = [strict(line) for line in lines]
    assert [row["step"] for row in rows] == [1, 2, 3]
    flagged = [row for row in rows if "nonfinite" in row]
    assert flagged, rows  # the update of step 1 overflows the weights: later gradients are NaN
    for row in flagged:
        assert all(row[name] is None for name in row["nonfinite"]) and row["skipped_steps"] >= 1
