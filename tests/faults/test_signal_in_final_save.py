"""SIGTERM (a scheduler, a VM shutting down) or SIGINT during the final weights save: the save completes and the
run says so; a second signal stops at once. No partial folder is left either way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from titanpod.checkpoint import load_model

WRAPPER = Path(__file__).with_name("signal_in_final_save.py")
RUN = ["--train.steps", "2", "--train.warmup-steps", "1", "--data.seq-len", "32", "--data.batch-size", "2",
       "--checkpoint.no-at-end", "--output.run-name", "signalled"]  # fmt: skip


def run(tmp_path: Path, signals: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, str(WRAPPER), signals, *RUN], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_during_the_final_save_lets_it_complete(tmp_path, name):
    done = run(tmp_path, name)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{name} came while saving the final weights: the save was completed first" in done.stdout
    folder = tmp_path / "runs" / "signalled"
    _, model = load_model(folder / "model")
    assert sum(p.numel() for p in model.parameters()) > 0
    assert not [path.name for path in folder.iterdir() if "partial" in path.name]


def test_a_second_signal_during_the_final_save_stops_at_once(tmp_path):
    done = run(tmp_path, "SIGTERM,SIGTERM")
    assert done.returncode == 128 + 15, done.stderr[-3000:]
    assert "stopped at once by SIGTERM while saving the final weights" in done.stdout
    folder = tmp_path / "runs" / "signalled"
    assert not (folder / "model").exists()
    assert not [path.name for path in folder.iterdir() if "partial" in path.name]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
