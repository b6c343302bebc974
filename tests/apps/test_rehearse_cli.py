"""``--rehearse``: each pod recipe runs on this machine as written, small, and resumes exactly.

Each rehearsal launches its own processes (4 gloo ranks for the torch executor, one
process with 8 host devices for the xla lane), so these tests are slow: a few minutes each
on 2 cores. They check the command's verdict and the report it writes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from titanpod.diffusion.cli import main as diffusion_main
from titanpod.recipes.rehearsal.scaling import STEPS

POD_RECIPES = ["llama3_8b", "llama3_70b", "llama3_405b", "qwen3_8b", "qwen3_32b", "qwen3_235b_a22b"]


def rehearse(recipe: str, runs_dir, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "COLUMNS": "160"}
    command = [sys.executable, "-m", "titanpod.pretrain.cli", "--recipe", recipe, "--rehearse",
               "--output.runs-dir", str(runs_dir), *extra]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    reports = list(runs_dir.glob(f"rehearse-{recipe}-*/rehearsal.json"))
    assert len(reports) == 1, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads(reports[0].read_text())


@pytest.mark.slow
@pytest.mark.parametrize("recipe", POD_RECIPES)
def test_pod_recipe_rehearsal_passes_on_the_cpu_and_xla_lanes(recipe, tmp_path):
    result, report = rehearse(recipe, tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert report["passed"]
    assert [lane["lane"] for lane in report["lanes"]] == ["cpu", "xla"]
    for lane in report["lanes"]:
        assert lane["passed"] and not lane["problems"]
        assert len(lane["losses"]) == STEPS and all(math.isfinite(loss) for loss in lane["losses"])
        assert lane["losses"][-1] < lane["losses"][0]
        assert lane["resume_difference"] <= 1e-5
        assert lane["weights_difference"] <= 1e-5
    settings = {row["name"]: row for row in report["settings"]["cpu"]}
    assert settings["train.step_mode"]["rehearsal"] == "whole_step"
    assert settings["kernels.attention"]["rehearsal"] == "splash (Pallas interpret mode)"
    assert "rehearsal of" in result.stdout and "pass" in result.stdout


def test_a_setting_that_cannot_be_honoured_stops_the_rehearsal_before_any_run(tmp_path, capsys):
    env_lane = ["--train.memory-policy", "offload"]
    command = [sys.executable, "-m", "titanpod.pretrain.cli", "--recipe", "llama3_8b", "--rehearse",
               "--output.runs-dir", str(tmp_path), *env_lane]  # fmt: skip
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2
    assert "train.memory_policy 'offload'" in result.stderr
    assert not list(tmp_path.glob("*/cpu"))


def test_flux_rehearsal_names_the_parallel_plan_it_cannot_run(capsys):
    assert diffusion_main(["--recipe", "flux1_12b", "--rehearse"]) == 2
    err = capsys.readouterr().err
    assert "parallel" in err and "does not shard" in err and "Nothing was run" in err
