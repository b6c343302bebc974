"""titanpod-pretrain end to end, as a user runs it (a real process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from PIL import Image

from tests.conftest import XLA_ENV
from titanpod.checkpoint import load_weights
from titanpod.pretrain.command import parse_recipe
from titanpod.recipes.families import build_model

SHORT_RUN = [
    "--train.steps", "6", "--train.warmup-steps", "2", "--train.log-every", "3",
    "--data.seq-len", "32", "--data.batch-size", "2",
]  # fmt: skip


def pretrain(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "titanpod.pretrain.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
        check=False,
    )


def test_short_run_writes_recipe_metrics_and_loadable_weights(tmp_path):
    result = pretrain(*SHORT_RUN, "--output.run-name", "smoke", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "runs" / "smoke"
    assert "titanpod-pretrain summary" in result.stdout and str(Path("runs") / "smoke") in result.stdout

    recipe = json.loads((run_dir / "recipe.json").read_text())
    assert recipe["name"] == "llama3_debug" and recipe["train"]["steps"] == 6 and recipe["data"]["seq_len"] == 32

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [3, 6]
    assert all(row["loss"] > 0 and row["tokens_per_second"] > 0 for row in rows)

    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    with Image.open(run_dir / "loss.png") as plot:  # the loss curve, drawn at the end
        assert plot.format == "PNG"

    assert (run_dir / "checkpoints" / "step-000006" / "trainer.json").is_file()  # the trainer state, to resume
    step_dir = run_dir / "model"
    assert json.loads((step_dir / "recipe.json").read_text()) == recipe
    model = build_model("llama3", "debug")
    model.to_empty(device="cpu")
    torch.nn.init.zeros_(model.tok_embeddings.weight)
    load_weights(model, step_dir)
    assert model.tok_embeddings.weight.abs().sum() > 0


def test_overrides_reach_the_recipe():
    recipe = parse_recipe(["--recipe", "llama3_debug", "--train.lr", "0.01", "--device.lane", "cpu"])
    assert recipe is not None
    assert recipe.train.lr == 0.01 and recipe.device.lane == "cpu" and recipe.name == "llama3_debug"


def test_list_recipes_and_bad_recipe_name(tmp_path):
    listed = pretrain("--list-recipes", cwd=tmp_path)
    assert listed.returncode == 0 and "llama3_debug" in listed.stdout
    wrong = pretrain("--recipe", "llama3_debgu", cwd=tmp_path)
    assert wrong.returncode == 2
    assert "Did you mean 'llama3_debug'" in wrong.stderr
    assert not (tmp_path / "runs").exists()


def test_unavailable_lane_fails_before_training_with_the_fix(tmp_path):
    result = pretrain(*SHORT_RUN, "--device.lane", "tpu", cwd=tmp_path)
    assert result.returncode == 1
    assert "pip install 'titanpod-device[tpu]'" in result.stderr
    assert "titanpod-pretrain summary" not in result.stdout  # no training started
    assert not (tmp_path / "runs").exists()


def test_whole_step_mode_with_a_memory_policy_runs_from_the_command_line(tmp_path):
    whole_step = ["--train.step-mode", "whole_step", "--train.memory-policy", "selective", "--train.compiler", "none"]
    result = pretrain(*SHORT_RUN, *whole_step, "--output.run-name", "whole", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "whole_step (memory policy selective, compiler none)" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "runs" / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [3, 6] and rows[-1]["skipped_steps"] == 0


def test_a_diverging_run_stops_with_a_message_when_asked(tmp_path):
    diverging = ["--train.lr", "1e30", "--train.warmup-steps", "0", "--train.no-skip-nonfinite"]
    result = pretrain(*SHORT_RUN[:2], *SHORT_RUN[6:], *diverging, "--output.run-name", "nan", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the gradient norm is nan" in result.stdout.replace("\n", " ").lower()
    assert "train.skip_nonfinite" in result.stdout.replace("\n", "")


def test_the_xla_lane_trains_through_one_jitted_step_and_saves_weights(tmp_path):
    xla = ["--device.lane", "xla", "--parallel.tp", "2", "--data.batch-size", "8"]
    args = [*SHORT_RUN[:-2], *xla, "--output.run-name", "xla"]
    result = pretrain(*args, cwd=tmp_path, env=XLA_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "whole_step (jax.jit, memory policy save)" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "runs" / "xla" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"]
    model = build_model("llama3", "debug")
    model.to_empty(device="cpu")
    load_weights(model, tmp_path / "runs" / "xla" / "model")
    initial = build_model("llama3", "debug", device="cpu")
    initial.init_weights(0)
    assert not torch.equal(model.layers[0].attention.wq.weight, initial.layers[0].attention.wq.weight)
