"""titanpod-diffusion under torchrun: the FLUX transformer sharded over gloo processes (FSDP, HSDP, FSDP x TP) trains
like one process.

Each data rank's loss is the mean over its own images, and the reported loss and the gradients are the mean
over the data ranks. One process computes the same objective over the same global batch as two accumulated
micro-batches: the images rank 0 and rank 1 read, in order, with the same noise and timesteps (they are
seeded by each sample's place in the global batch, not by the rank).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.torch import load_file

from tests.cli_runs import run_cli

STEPS = 5
LR = 2e-3  # flux_debug's
RUN = [
    "--recipe", "flux_debug", "--device.lane", "cpu", "--train.steps", str(STEPS), "--train.warmup-steps", "1",
    "--train.log-every", "1", "--data.resolution", "16", "--data.batch-size", "2", "--data.shapes-count", "32",
    "--samples.prompts", "2", "--samples.steps", "2", "--output.no-tensorboard",
]  # fmt: skip
WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"
FINAL_SAMPLES = f"samples/step-{STEPS:06d}.png"


def diffusion(cwd: Path, *args: str, processes: int = 1) -> subprocess.CompletedProcess[str]:
    result = run_cli("titanpod.diffusion.cli", [*RUN, *args], cwd, processes)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


@pytest.mark.slow
def test_fsdp2_and_hsdp_on_two_processes_equal_one_process_over_the_same_global_batch(tmp_path):
    fsdp = diffusion(tmp_path, "--parallel.fsdp", "2", "--output.run-name", "fsdp", processes=2)
    assert fsdp.stdout.count("titanpod-diffusion summary") == 1  # rank 0 alone reports
    assert fsdp.stdout.count("titanpod-diffusion: recipe flux_debug") == 1  # and prints the header
    hsdp = ["--parallel.dp-replicate", "2", "--parallel.fsdp", "1"]  # whole on each rank, gradients averaged
    diffusion(tmp_path, *hsdp, "--output.run-name", "hsdp", processes=2)
    diffusion(tmp_path, "--train.grad-accum-steps", "2", "--output.run-name", "one")
    runs = tmp_path / "runs"
    assert sorted(path.name for path in runs.iterdir()) == ["fsdp", "hsdp", "one"]
    one = losses(runs / "one")
    assert len(one) == STEPS
    one_weights = load_file(runs / "one" / WEIGHTS)
    one_samples = np.asarray(Image.open(runs / "one" / FINAL_SAMPLES), dtype=np.int16)
    for name in ("fsdp", "hsdp"):
        sharded = losses(runs / name)
        assert len(sharded) == STEPS, name
        for step, (got, want) in enumerate(zip(sharded, one, strict=True), 1):
            assert abs(got - want) <= 1e-5 * abs(want), f"{name} step {step}: {got} vs {want}"
        # The final transformer is written whole by rank 0. Each tensor within 1e-5 of its norm: entry by entry,
        # Adam divides by the gradient's own scale, so an entry whose gradient is near zero turns reduction-order
        # rounding into a visible difference; none may differ by more than its updates could move it.
        weights = load_file(runs / name / WEIGHTS)
        assert weights.keys() == one_weights.keys(), name
        for key, want in one_weights.items():
            assert weights[key].shape == want.shape, f"{name} {key}"
            assert (weights[key] - want).norm().item() <= 1e-5 * max(want.norm().item(), 1e-12), f"{name} {key}"
            assert (weights[key] - want).abs().max().item() <= STEPS * LR, f"{name} {key}"
        # The sample grid was drawn by both ranks in the sharded forward and written once by rank 0: the same
        # picture as one process's, to one 8-bit level (a pixel on a rounding boundary may fall either way).
        samples = np.asarray(Image.open(runs / name / FINAL_SAMPLES), dtype=np.int16)
        assert samples.shape == one_samples.shape, name
        assert np.abs(samples - one_samples).max() <= 1, name


@pytest.mark.slow
def test_a_sharded_run_stopped_and_resumed_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    # The checkpoints are sharded (each rank saves its shards); both runs share one encodings cache folder,
    # which two ranks fill at once.
    sharded = ["--parallel.fsdp", "2", "--checkpoint.every", "2", "--model.encodings-cache", str(tmp_path / "cache")]
    diffusion(tmp_path, *sharded, "--output.run-name", "straight", processes=2)
    diffusion(tmp_path, *sharded, "--output.run-name", "split", "--train.stop-at-step", "2", processes=2)
    resumed = diffusion(tmp_path, *sharded, "--output.run-name", "split", processes=2)
    assert "resumed from" in resumed.stdout
    runs = tmp_path / "runs"
    assert losses(runs / "split") == losses(runs / "straight")
    expected, got = load_file(runs / "straight" / WEIGHTS), load_file(runs / "split" / WEIGHTS)
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert got[name].equal(tensor), name
    assert list((tmp_path / "cache").glob("*.safetensors")) and not list((tmp_path / "cache").glob(".*.partial"))


def assert_same_training(run_dir: Path, reference_dir: Path) -> None:
    """Losses step by step within 1e-5 relative, and each final tensor within 1e-5 of its norm (and no entry
    further than its updates could move it), as for FSDP above."""
    got, want = losses(run_dir), losses(reference_dir)
    assert len(got) == len(want) == STEPS
    for step, (a, b) in enumerate(zip(got, want, strict=True), 1):
        assert abs(a - b) <= 1e-5 * abs(b), f"{run_dir.name} step {step}: {a} vs {b}"
    weights, reference = load_file(run_dir / WEIGHTS), load_file(reference_dir / WEIGHTS)
    assert weights.keys() == reference.keys()
    for key, want_tensor in reference.items():
        difference = weights[key] - want_tensor
        assert difference.norm().item() <= 1e-5 * max(want_tensor.norm().item(), 1e-12), f"{run_dir.name} {key}"
        assert difference.abs().max().item() <= STEPS * LR, f"{run_dir.name} {key}"


@pytest.mark.slow
def test_fsdp2_by_tp2_flux_on_four_processes_equals_one_process_over_the_same_global_batch(tmp_path):
    # Two data ranks of two tp ranks each (tp ranks read the same images); one process accumulates the two data
    # ranks' batches. Heads and MLP units of every double and single block split over the tp ranks (the single
    # block's fused linears by blocks). Measured: losses equal to the last printed digit, worst tensor 2e-6 of
    # its norm (tp 2 alone, 2 processes against one: 4.8e-7).
    layout = ["--parallel.tp", "2", "--parallel.fsdp", "2"]
    diffusion(tmp_path, *layout, "--output.run-name", "fsdp_tp", processes=4)
    diffusion(tmp_path, "--train.grad-accum-steps", "2", "--output.run-name", "one")
    assert_same_training(tmp_path / "runs" / "fsdp_tp", tmp_path / "runs" / "one")
