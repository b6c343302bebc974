"""A real training process killed with SIGKILL while a background save is being written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUN = [
    "--train.steps", "24", "--train.warmup-steps", "2", "--train.log-every", "1",
    "--data.seq-len", "32", "--data.batch-size", "2",
    "--checkpoint.every", "1", "--checkpoint.async-save", "--checkpoint.keep-last", "3",
]  # fmt: skip
ENV = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "COLUMNS": "200"}


def command(run_name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "titanpod.pretrain.cli", *RUN, "--output.run-name", run_name, *extra]


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows}  # after a resume, the resumed run's lines come last


def kill_during_a_save(cwd: Path, checkpoints: Path) -> Path:
    """Start a run and SIGKILL it while a save's files are being written; returns the partial folder."""
    process = subprocess.Popen(command("victim"), cwd=cwd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            complete = list(checkpoints.glob("step-*")) if checkpoints.is_dir() else []
            writing = [p for p in checkpoints.glob(".step-*.partial") if any((p / "state").glob("*"))]
            if len(complete) >= 2 and writing:
                process.send_signal(signal.SIGKILL)
                process.wait()
                return writing[0]
            time.sleep(0.002)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    raise AssertionError(f"never caught a save in flight; the run ended with {process.returncode}")


@pytest.mark.slow
def test_sigkill_during_a_background_save_loses_nothing(tmp_path):
    straight = subprocess.run(
        command("straight", "--checkpoint.resume", "never"), cwd=tmp_path, env=ENV, capture_output=True, text=True
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    checkpoints = tmp_path / "runs" / "victim" / "checkpoints"
    partial = kill_during_a_save(tmp_path, checkpoints)
    assert partial.is_dir()  # the kill landed mid-save: the folder never became a checkpoint
    last_complete = max(int(p.name.split("-")[1]) for p in checkpoints.glob("step-*"))

    resumed = subprocess.run(command("victim"), cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout.replace("\n", "")
    assert f"removed runs/victim/checkpoints/{partial.name}" in out and "incomplete checkpoint" in out
    assert f"{last_complete} of 24 steps done" in out
    assert not partial.exists()
    assert losses(tmp_path / "runs" / "victim") == losses(tmp_path / "runs" / "straight")  # every step, bit for bit
