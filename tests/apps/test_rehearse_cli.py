"""``--rehearse``: each pod recipe runs on this machine as written, small, and resumes exactly (the FLUX one too).

Each rehearsal launches its own processes (4 gloo ranks for the torch executor, one
process with 8 host devices for the xla lane), so these tests are slow: one to five minutes
each on 2 cores. They check the command's verdict and the report it writes.

The slow tier (``pytest -m slow``) rehearses two pairs (``DEFAULT_RUN``): llama3_405b on the xla lane
(FSDP x TP, Splash, the Pallas loss) and qwen3_235b_a22b on the cpu lane (MoE with EP, gmm and a
capacity, four gloo ranks). Every other recipe-lane pair is marked ``rehearsal_full`` and runs with
``pytest -m slow --rehearse-all`` (the full set, by hand, before a release).
On the xla lane a resumed run must match the uninterrupted one exactly, resuming from Orbax.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from titanpod.diffusion.cli import main as diffusion_main
from titanpod.recipes.rehearsal.scaling import STEPS, STOP_AT

POD_RECIPES = ["llama3_8b", "llama3_70b", "llama3_405b", "qwen3_06b", "qwen3_8b", "qwen3_32b", "qwen3_235b_a22b"]
DEFAULT_RUN = {("llama3_405b", "xla"), ("qwen3_235b_a22b", "cpu")}
"""The recipe-lane pairs the slow tier rehearses: each lane's launch, stop and resume once, FSDP x TP with Splash
and the Pallas loss on the xla lane, MoE with EP, gmm and a capacity on the cpu lane. The same combinations on
the other lane are trained against one process by tests/parallel (test_torchrun.py, test_layout_parity_cli.py)."""
CASES = [
    pytest.param(recipe, lane, marks=[pytest.mark.slow] + ([] if (recipe, lane) in DEFAULT_RUN else
                                                           [pytest.mark.rehearsal_full]))
    for recipe in POD_RECIPES
    for lane in ("cpu", "xla")
]  # fmt: skip
CASES.append(  # pipeline stages are rehearsed on the cpu lane only (the xla executor builds none)
    pytest.param("llama3_405b_pp", "cpu", marks=[pytest.mark.slow, pytest.mark.rehearsal_full])
)
# AdamW's moments in host memory with stacked blocks, through a stop and a resume: the xla lane alone keeps them there.
CASES.append(pytest.param("llama32_1b", "xla", marks=[pytest.mark.slow]))


def rehearse(
    recipe: str, runs_dir, *extra: str, cli: str = "titanpod.pretrain.cli"
) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "COLUMNS": "160"}
    # The runs folder as a user names it, relative to where the command starts (the runs start elsewhere).
    command = [sys.executable, "-m", cli, "--recipe", recipe, "--rehearse",
               "--output.runs-dir", runs_dir.name, *extra]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=runs_dir.parent, timeout=1800)
    reports = list(runs_dir.glob(f"rehearse-{recipe}-*/rehearsal.json"))
    assert len(reports) == 1, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads(reports[0].read_text())


@pytest.mark.parametrize(("recipe", "lane"), CASES)
def test_pod_recipe_rehearsal_passes(recipe, lane, tmp_path):
    result, report = rehearse(recipe, tmp_path, "--rehearse-lanes", lane)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert report["passed"]
    assert [entry["lane"] for entry in report["lanes"]] == [lane]
    entry = report["lanes"][0]
    assert not entry["problems"]
    assert len(entry["losses"]) == STEPS and all(math.isfinite(loss) for loss in entry["losses"])
    assert entry["losses"][-1] < entry["losses"][0]
    assert entry["resume_difference"] <= 1e-5
    assert entry["weights_difference"] <= 1e-5
    if lane == "xla":  # one deterministic program (the same executable, from JAX's cache): exact, from Orbax
        assert entry["resume_difference"] == 0.0 and entry["weights_difference"] == 0.0
        (checkpoint,) = tmp_path.glob(f"rehearse-{recipe}-*/xla/resumed/checkpoints/step-{STOP_AT:06d}")
        assert (checkpoint / "orbax").is_dir()
    settings = {row["name"]: row for row in report["settings"][lane]}
    assert settings["train.step_mode"]["rehearsal"] == "whole_step"
    assert settings["kernels.attention"]["rehearsal"] == "splash (Pallas interpret mode)"
    assert settings["device.lane"]["rehearsal"] == lane
    if recipe == "qwen3_235b_a22b":
        assert settings["kernels.expert_matmul"]["rehearsal"] == "gmm (Pallas interpret mode)"
        assert settings["parallel.ep"]["rehearsal"].startswith("2 ")
        assert entry["dropped_tokens"] is not None  # counted (capacity factor 1.25)
    assert "rehearsal passed" in result.stdout


def test_a_setting_that_cannot_be_honoured_stops_the_rehearsal_before_any_run(tmp_path, capsys):
    env_lane = ["--train.memory-policy", "offload"]
    command = [sys.executable, "-m", "titanpod.pretrain.cli", "--recipe", "llama3_8b", "--rehearse",
               "--output.runs-dir", str(tmp_path), *env_lane]  # fmt: skip
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2
    assert "train.memory_policy 'offload'" in result.stderr
    assert not list(tmp_path.glob("*/cpu"))


@pytest.mark.slow
@pytest.mark.parametrize(  # the cpu lane's sharded FLUX step is trained against one process in tests/runs
    "lane", [pytest.param("cpu", marks=pytest.mark.rehearsal_full), "xla"]
)
def test_flux1_12b_rehearsal_passes(lane, tmp_path):
    result, report = rehearse("flux1_12b", tmp_path, "--rehearse-lanes", lane, cli="titanpod.diffusion.cli")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert report["passed"] and [entry["lane"] for entry in report["lanes"]] == [lane]
    entry = report["lanes"][0]
    assert not entry["problems"]
    assert len(entry["losses"]) == STEPS and all(math.isfinite(loss) for loss in entry["losses"])
    assert entry["losses"][-1] < entry["losses"][0]
    # The same program on the same devices, resumed from its checkpoint: exact on both lanes.
    assert entry["resume_difference"] == 0.0 and entry["weights_difference"] == 0.0
    (folder,) = tmp_path.glob("rehearse-flux1_12b-*")
    assert (folder / lane / "resumed" / "checkpoints" / f"step-{STOP_AT:06d}").is_dir()
    for step in (STOP_AT, STEPS):  # a grid mid-run (the run trained on after it, to the same losses) and at the end
        assert (folder / lane / "uninterrupted" / "samples" / f"step-{step:06d}.png").is_file()
    settings = {row["name"]: row for row in report["settings"][lane]}
    assert settings["device.lane"]["rehearsal"] == lane
    devices = {"cpu": "4 (torch executor, gloo processes)", "xla": "8 (XLA SPMD, host devices)"}[lane]
    assert settings["parallel.fsdp"] == {"name": "parallel.fsdp", "recipe": "all the rest", "rehearsal": devices}
    for kept in ("parallel.param_dtype", "train.precision", "train.memory_policy", "train.decay", "data.source"):
        assert settings[kept]["rehearsal"] == settings[kept]["recipe"], kept
    assert settings["model.double : single blocks"]["rehearsal"] == "1 : 2"
    assert settings["kernels.attention"]["rehearsal"] == "splash (Pallas interpret mode)"
    assert settings["data.resolution"] == {"name": "data.resolution", "recipe": "1024", "rehearsal": "64"}
    assert "rehearsal passed" in result.stdout


def test_a_flux_setting_that_cannot_be_honoured_stops_the_rehearsal_before_any_run(tmp_path, capsys):
    runs = tmp_path / "runs"
    offload = ["--train.step-mode", "whole_step", "--train.memory-policy", "offload"]  # no pinned memory on xla
    argv = ["--recipe", "flux1_12b", "--rehearse", *offload, "--output.runs-dir", str(runs)]
    assert diffusion_main(argv) == 2
    assert "train.memory_policy 'offload'" in capsys.readouterr().err
    assert not runs.exists()  # nothing was written, let alone run


def test_a_missing_or_broken_recipe_file_is_named(tmp_path, capsys):
    from titanpod.pretrain.cli import main as pretrain_main

    assert pretrain_main(["--recipe", str(tmp_path / "missing.json"), "--rehearse"]) == 2
    assert "no such recipe file" in capsys.readouterr().err
    broken = tmp_path / "recipe.json"
    broken.write_text('{"name": 1')
    assert pretrain_main(["--recipe", str(broken)]) == 2
    assert f"--recipe {broken} is not valid JSON" in capsys.readouterr().err
