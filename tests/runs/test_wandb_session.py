"""Tiny pretraining runs with W&B: a resumed run continues the same W&B run (offline, as WANDB_MODE asks), a
run without a W&B login trains without W&B, and one that requires W&B stops before any work, leaving no run
directory behind."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tests.graph.wandb_records import history, offline_environment, wandb_records
from titanpod.pretrain.command import parse_recipe
from titanpod.runs import run_pretraining
from titanpod.runs.pretrain import with_resume
from titanpod.runs.wandb_run import RUN_ID_FILE, WandbStartError

TINY = [
    "--recipe", "llama3_debug", "--device.lane", "cpu", "--train.warmup-steps", "1", "--train.log-every", "1",
    "--data.seq-len", "32", "--data.batch-size", "2", "--output.save-weights", "False",
    "--output.tensorboard", "False", "--output.wandb", "titanpod-test",
]  # fmt: skip


def tiny(tmp_path, *flags: str):
    """The tiny recipe, its run ``run`` under ``tmp_path``, with ``flags``."""
    recipe = parse_recipe([*TINY, "--output.runs-dir", str(tmp_path), "--output.run-name", "run", *flags])
    assert recipe is not None
    return recipe


@pytest.mark.slow  # two runs, each starting W&B's service process
def test_a_resumed_run_continues_its_offline_wandb_run(tmp_path, monkeypatch, clean_wandb_environment):
    for name, value in offline_environment(tmp_path).items():  # WANDB_MODE=offline, --output.wandb-mode unset
        monkeypatch.setenv(name, value)
    run_pretraining(tiny(tmp_path, "--train.steps", "2"))
    run_dir = tmp_path / "run"
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    [first] = list((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    assert sorted(history(wandb_records(first / f"run-{run_id}.wandb"))) == [1, 2]

    run_pretraining(with_resume(tiny(tmp_path, "--train.steps", "4")))
    assert (run_dir / RUN_ID_FILE).read_text().strip() == run_id
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert {folder.name.rsplit("-", 1)[1] for folder in folders} == {run_id}
    assert sorted(history(wandb_records(folders[-1] / f"run-{run_id}.wandb"))) == [3, 4]  # where the first left off


def test_without_a_login_the_run_trains_without_wandb(tmp_path, not_logged_in):
    console = Console(file=io.StringIO(), width=400)
    result = run_pretraining(tiny(tmp_path / "runs", "--train.steps", "2"), console)
    said = console.file.getvalue()
    assert "W&B could not start the online run" in said and "wandb login" in said and "WANDB_MODE=offline" in said
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == [1, 2]
    assert not (result.run_dir / RUN_ID_FILE).exists()


def test_without_a_login_a_required_wandb_stops_before_any_work_and_leaves_no_run_directory(tmp_path, not_logged_in):
    runs = tmp_path / "runs"
    with pytest.raises(WandbStartError, match="wandb login"):
        run_pretraining(tiny(runs, "--train.steps", "2", "--output.wandb-required"))
    assert not (runs / "run").exists()
