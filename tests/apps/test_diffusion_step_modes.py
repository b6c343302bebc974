"""titanpod-diffusion trains the same run in the eager step, the captured whole step and on the xla lane.

Each run is the short flux_debug run of 6 steps on the same images, noise and timesteps; losses are
logged every step and the trained transformer is read back from the run's ``transformer/`` folder.
Tolerances (fp32): each step's loss within 1e-5 relative of eager's; all parameters as one vector
within 1e-5 of their norm (``||p - p_eager|| / ||p_eager||``). Measured in each test's comment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import XLA_ENV

SHORT = [
    "--train.steps", "6", "--train.warmup-steps", "1", "--train.log-every", "1",
    "--data.resolution", "16", "--data.batch-size", "4", "--data.shapes-count", "32",
    "--samples.prompts", "2", "--samples.steps", "2", "--samples.every", "0",
]  # fmt: skip


def trained(tmp_path, name: str, *args: str, env: dict[str, str] | None = None) -> tuple[list[float], dict]:
    """Run titanpod-diffusion ``SHORT`` plus ``args``; its per-step losses and its trained transformer."""
    result = subprocess.run(
        [sys.executable, "-m", "titanpod.diffusion.cli", *SHORT, "--output.run-name", name, *args],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "runs" / name
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert len(losses) == 6
    return losses, load_file(run_dir / "transformer" / "diffusion_pytorch_model.safetensors")


def differences(run: tuple[list[float], dict], reference: tuple[list[float], dict]) -> tuple[float, float]:
    """The largest relative loss difference, and ``||p - p_ref|| / ||p_ref||`` over every parameter."""
    (losses, params), (ref_losses, ref_params) = run, reference
    loss = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    assert params.keys() == ref_params.keys()
    difference = torch.cat([(params[name] - ref).flatten() for name, ref in ref_params.items()])
    whole = torch.cat([ref.flatten() for ref in ref_params.values()])
    figures = (loss, (difference.norm() / whole.norm()).item())
    print("loss, parameters:", figures)
    return figures


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("eager"), "eager", "--train.step-mode", "eager")


@pytest.mark.parametrize("policy", ["save", "recompute"])
def test_the_whole_step_trains_the_eager_run(eager, tmp_path, policy):
    # measured: losses and weights equal (0.0) for both policies
    whole = trained(tmp_path, policy, "--train.step-mode", "whole_step", "--train.compiler", "none",
                    "--train.memory-policy", policy)  # fmt: skip
    loss, params = differences(whole, eager)
    assert loss < 1e-5 and params < 1e-5, (loss, params)


@pytest.mark.slow  # compiles the step with XLA in a process of its own
# recompute only: the save policy's xla step is checked in process (tests/graph/test_flux_whole_step.py)
@pytest.mark.parametrize("policy", ["recompute"])
def test_the_xla_lane_trains_the_eager_run(eager, tmp_path, policy):
    # measured: losses within 1.0e-6, weights within 6.8e-7 (both policies)
    one_device = {**XLA_ENV, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}  # eager's batch of 4
    xla = trained(tmp_path, policy, "--device.lane", "xla", "--train.step-mode", "whole_step",
                  "--train.memory-policy", policy, env=one_device)  # fmt: skip
    loss, params = differences(xla, eager)
    assert loss < 1e-5 and params < 1e-5, (loss, params)


def test_block_recompute_as_a_model_flag_is_refused_where_the_memory_policy_recomputes(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "titanpod.diffusion.cli", *SHORT, "--train.step-mode", "whole_step",
         "--model.recompute-blocks"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "--train.memory-policy recompute" in result.stdout + result.stderr
