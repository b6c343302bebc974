"""FLUX.1's debug recipe on the xla lane on a TPU chip: its whole step trains like the same run on JAX's CPU, saves,
stops and resumes bit for bit, and draws its samples.

The chip's runs are ``titanpod-diffusion`` called in this process (one program holds the chip); the reference is the
same command in a process of its own with ``JAX_PLATFORMS=cpu``, which keeps it off the chip. Tolerances: each of the
20 steps' losses within 5% of the CPU's, the first within 2% (fp32 parameters; a TPU multiplies fp32 matrices in
bf16 passes at JAX's default precision, the CPU in fp32); a resumed run's losses and transformer equal the
uninterrupted run's exactly (the same programs on the same chip from the same saved state).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.chip

RUN = [
    "--device.lane", "xla", "--train.step-mode", "whole_step", "--train.steps", "20", "--train.warmup-steps", "2",
    "--train.log-every", "1", "--checkpoint.every", "10", "--checkpoint.no-async-save",
    "--data.batch-size", "8", "--data.shapes-count", "256", "--samples.prompts", "2", "--samples.steps", "4",
]  # fmt: skip
TRANSFORMER = Path("transformer") / "diffusion_pytorch_model.safetensors"


def diffusion(runs: Path, name: str, *flags: str) -> int:
    """``titanpod-diffusion`` (flux_debug) in this process; its exit code."""
    from titanpod.diffusion.cli import main

    return main([*RUN, "--output.runs-dir", str(runs), "--output.run-name", name, *flags])


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flux-runs")


@pytest.fixture(scope="module")
def whole(runs: Path) -> Path:
    assert diffusion(runs, "flux-whole") == 0
    return runs / "flux-whole"


def test_flux_debug_trains_on_the_chip_like_on_the_cpu_and_keeps_everything(whole, runs):
    command = [sys.executable, "-m", "titanpod.diffusion.cli", *RUN, "--output.runs-dir", str(runs),
               "--output.run-name", "flux-cpu"]  # fmt: skip
    cpu_only = {**os.environ, "JAX_PLATFORMS": "cpu", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
                "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=cpu_only, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ours, cpu = losses(whole), losses(runs / "flux-cpu")
    assert sorted(ours) == sorted(cpu) == list(range(1, 21)) and all(math.isfinite(v) for v in ours.values())
    assert ours[1] == pytest.approx(cpu[1], rel=2e-2)
    assert all(ours[step] == pytest.approx(cpu[step], rel=5e-2) for step in cpu)
    assert ours[20] < ours[1]
    for step in (10, 20):
        assert (whole / "checkpoints" / f"step-{step:06d}" / "COMMITTED").is_file()
    assert (whole / TRANSFORMER).is_file()
    assert list((whole / "samples").glob("*.png"))


def test_a_stopped_flux_run_resumes_to_the_same_losses_and_transformer_bit_for_bit(whole, runs):
    from safetensors.torch import load_file

    assert diffusion(runs, "flux-stopped", "--train.stop-at-step", "10") == 0
    assert diffusion(runs, "flux-stopped") == 0  # the same command resumes from step 10
    assert losses(runs / "flux-stopped") == losses(whole)
    resumed, uninterrupted = (load_file(run / TRANSFORMER) for run in (runs / "flux-stopped", whole))
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[key], uninterrupted[key]) for key in resumed)
