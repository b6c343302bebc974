"""A full disk on rank 0 while it streams the sharded final weights: rank 0 names the folder and the bytes, the
ranks gathering for it stop within seconds (no rank waits in a gather), and one of them names the rank lost and the
checkpoint to resume from. Nothing partial is left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel.test_torchrun import free_port

WRAPPER = Path(__file__).with_name("full_disk_on_rank0.py")


@pytest.mark.slow
def test_a_full_disk_on_rank_0_during_the_sharded_save_stops_every_rank(tmp_path):
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", str(free_port())]  # fmt: skip
    args = ["--train.steps", "2", "--train.warmup-steps", "1", "--data.seq-len", "32", "--data.batch-size", "1",
            "--parallel.fsdp", "2", "--output.run-name", "full"]  # fmt: skip
    done = subprocess.run(
        [*torchrun, str(WRAPPER), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "No space left on the device while writing runs/full/model" in done.stderr, done.stderr[-3000:]
    assert "titanpod: the job lost rank 0 of 2 ranks" in done.stderr, done.stderr[-3000:]
    assert "newest complete checkpoint runs/full/checkpoints/step-000002" in done.stderr
    run_dir = tmp_path / "runs" / "full"
    assert not (run_dir / "model").exists()
    assert not [path.name for path in run_dir.iterdir() if "partial" in path.name]
