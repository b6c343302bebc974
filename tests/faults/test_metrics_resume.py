"""A run resumed from a checkpoint older than its last metrics row (it went on past its last save, then died)
leaves one row per step in metrics.jsonl: the earlier attempt's rows past the checkpoint are set aside in a file
beside it, not deleted."""

from __future__ import annotations

import json

import pytest

from tests.cli_runs import run_cli
from titanpod.graph import JsonlWriter
from titanpod.graph.metrics_rows import set_aside_rows_after


def test_the_rows_past_the_resumed_step_are_set_aside_in_order(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": step, "loss": float(step)}) for step in range(1, 8)]
    lines.insert(4, json.dumps({"step": 4, "validation_loss": 1.0}))
    path.write_text("\n".join(lines) + '\n{"step": 8, "lo', encoding="utf-8")  # the last line cut short by a kill
    aside = set_aside_rows_after(path, 4)
    assert aside is not None and aside.parent == tmp_path and aside.name.startswith("metrics-after-step-4-")
    assert path.read_text().splitlines() == lines[:5]
    assert aside.read_text().splitlines() == [*lines[5:], '{"step": 8, "lo']
    assert set_aside_rows_after(path, 4) is None  # nothing past step 4 now: the file is left as it is


def test_the_writer_goes_on_appending_after_setting_rows_aside(tmp_path):
    writer = JsonlWriter(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3):
        writer.write_scalars(step, {"loss": 1.0})
    assert writer.set_aside_after(1) is not None
    writer.write_scalars(2, {"loss": 0.5})
    writer.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]


@pytest.mark.slow
def test_a_run_resumed_from_an_older_checkpoint_keeps_one_row_per_step(tmp_path):
    run = ["--train.steps", "8", "--train.warmup-steps", "1", "--train.log-every", "1", "--data.seq-len", "32",
           "--data.batch-size", "2", "--checkpoint.every", "4", "--output.run-name", "r", "--output.no-tensorboard",
           "--output.no-save-weights"]  # fmt: skip
    # Steps 1..7, a checkpoint at 4 only: as a process that died at step 7 leaves its run.
    died = run_cli("titanpod.pretrain.cli", [*run, "--train.stop-at-step", "7", "--checkpoint.no-at-end"], tmp_path)
    assert died.returncode == 0, died.stderr[-3000:]
    run_dir = tmp_path / "runs" / "r"
    first = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in first] == [1, 2, 3, 4, 5, 6, 7]

    resumed = run_cli("titanpod.pretrain.cli", run, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "step-000004" in resumed.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert rows[:4] == first[:4]
    [aside] = run_dir.glob("metrics-after-step-4-*.jsonl")
    assert [json.loads(line) for line in aside.read_text().splitlines()] == first[4:]
