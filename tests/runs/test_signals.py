"""SIGTERM and SIGINT on a real titanpod-pretrain process: what is saved, the exit status, and an exact resume.

The run signals itself at a known step (``signalling_pretrain.py``), so each signal lands where it must.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

RUN = [
    "--train.steps", "6", "--train.warmup-steps", "2", "--train.log-every", "1",
    "--data.source", "synthetic", "--data.seq-len", "32", "--data.batch-size", "2", "--checkpoint.every", "2",
]  # fmt: skip
ENV = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
"""One thread per process: a tiny model's steps gain nothing from more, and a busy host loses much."""
SIGNALLING = Path(__file__).with_name("signalling_pretrain.py")


def pretrain(cwd: Path, *args: str, signal_at: tuple[int, str] | None = None) -> subprocess.CompletedProcess[str]:
    """titanpod-pretrain with ``RUN`` and ``args``; with ``signal_at=(step, "SIGINT,SIGINT")`` it signals itself."""
    start = ["-m", "titanpod.pretrain.cli"] if signal_at is None else [str(SIGNALLING), str(signal_at[0]), signal_at[1]]
    command = [sys.executable, *start, *RUN, *args]
    return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300, check=False)


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows}  # a resumed run's lines come last


def saved_positions(checkpoints: Path) -> dict[int, int]:
    """Each complete checkpoint's step and the data position (batches served) it saved with it."""
    trainers = [json.loads((folder / "trainer.json").read_text()) for folder in checkpoints.glob("step-*")]
    return {trainer["step"]: trainer["data"]["index"] for trainer in trainers}


@pytest.mark.slow
def test_two_sigints_save_nothing_and_sigterm_saves_the_step_reached_and_the_resume_is_exact(tmp_path):
    straight = pretrain(tmp_path, "--output.run-name", "straight", "--train.stop-at-step", "5")
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]
    run_dir = tmp_path / "runs" / "victim"
    checkpoints = run_dir / "checkpoints"

    # Two SIGINTs with no wait, as step 4 starts (its batch already read): stop at once, write nothing.
    cut = pretrain(tmp_path, "--output.run-name", "victim", signal_at=(4, "SIGINT,SIGINT"))
    assert cut.returncode == 130, cut.stdout[-3000:] + cut.stderr[-3000:]
    newest = Path("runs", "victim", "checkpoints", "step-000002")
    assert (
        f"stopped at once by SIGINT after step 3, the next step cut short: saved nothing; newest checkpoint {newest}"
        in cut.stdout
    )
    assert saved_positions(checkpoints) == {2: 2}  # the interval save of step 2 only, no step 3 one batch ahead
    assert not (run_dir / "model").exists()  # the weights may be mid-step: not saved

    # Resumed, SIGTERM as step 5 starts: step 5 finishes, its checkpoint and weights are saved, exit 143.
    stopped = pretrain(tmp_path, "--output.run-name", "victim", signal_at=(5, "SIGTERM"))
    assert stopped.returncode == 143, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    assert "2 of 6 steps done" in stopped.stdout
    saved = Path("runs", "victim", "checkpoints", "step-000005")
    assert f"stopped by SIGTERM after step 5: saved checkpoint {saved}" in stopped.stdout
    assert saved_positions(checkpoints) == {4: 4, 5: 5}  # every checkpoint pairs step N with N batches read

    assert losses(run_dir) == losses(tmp_path / "runs" / "straight")  # steps 1-5, no batch skipped, bit for bit
    ours = load_file(run_dir / "model" / "model.safetensors")
    theirs = load_file(tmp_path / "runs" / "straight" / "model" / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[name], theirs[name]) for name in theirs)
