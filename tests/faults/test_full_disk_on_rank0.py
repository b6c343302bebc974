"""A full disk on rank 0 while it streams the sharded final weights: rank 0 names the folder and the bytes, the
ranks gathering for it stop within seconds (no rank waits in a gather), and one of them names the rank lost and the
checkpoint to resume from. During a sharded trainer-state save (in the foreground or the background) every rank
stops with the same message. Nothing partial is left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel.test_torchrun import free_port

WRAPPER = Path(__file__).with_name("full_disk_on_rank0.py")


ARGS = ["--train.steps", "2", "--train.warmup-steps", "1", "--data.seq-len", "32", "--data.batch-size", "1",
        "--parallel.fsdp", "2", "--output.run-name", "full"]  # fmt: skip


def run_two_ranks(tmp_path: Path, what: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", str(free_port())]  # fmt: skip
    return subprocess.run(
        [*torchrun, str(WRAPPER), what, *ARGS, *extra], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_a_full_disk_on_rank_0_during_the_sharded_save_stops_every_rank(tmp_path):
    done = run_two_ranks(tmp_path, "weights")
    assert done.returncode != 0
    assert "No space left on the device while writing runs/full/model" in done.stderr, done.stderr[-3000:]
    assert "titanpod: the job lost rank 0 of 2 ranks" in done.stderr, done.stderr[-3000:]
    assert "newest complete checkpoint runs/full/checkpoints/step-000002" in done.stderr
    run_dir = tmp_path / "runs" / "full"
    assert not (run_dir / "model").exists()
    assert not [path.name for path in run_dir.iterdir() if "partial" in path.name]


@pytest.mark.slow
@pytest.mark.parametrize("background", [False, True])
def test_a_full_disk_on_rank_0_during_a_sharded_checkpoint_stops_every_rank(tmp_path, background):
    done = run_two_ranks(tmp_path, "checkpoint", "--checkpoint.every", "1", *(["--checkpoint.async-save"] * background))
    assert done.returncode != 0
    full = "No space left on the device while writing runs/full/checkpoints/.step-000001.partial"
    assert done.stderr.count(full) == 2, done.stderr[-3000:]  # each rank stops, saying why
    checkpoints = tmp_path / "runs" / "full" / "checkpoints"
    left = sorted(path.name for path in checkpoints.iterdir()) if checkpoints.exists() else []
    assert left == []  # no partial step folder, and no step folder passed off as complete
