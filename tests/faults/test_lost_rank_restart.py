"""A rank killed mid-run under ``titanpod-launch --max-restarts 1``: the job names the lost rank, restarts, resumes
from its newest complete checkpoint by itself and ends with the losses of a run that was never interrupted."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.parallel.test_torchrun import free_port

STEPS, EVERY, KILL_AFTER = 30, 5, 12
"""Steps of the run, its checkpoint interval, and the logged step after which rank 2 is killed."""
RUN = ["--train.steps", str(STEPS), "--train.warmup-steps", "1", "--train.log-every", "1", "--data.seq-len", "32",
       "--data.batch-size", "1", "--parallel.fsdp", "4", "--checkpoint.every", str(EVERY)]  # fmt: skip


def launch(cwd: Path, name: str, marker: str) -> subprocess.Popen[str]:
    """``titanpod-launch --max-restarts 1`` of 4 gloo ranks on this host, its output captured."""
    bin_dir = Path(sys.executable).parent
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TORCHELASTIC", "MASTER_"))}
    env |= {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1", "COLUMNS": "200", "FAULT_MARKER": marker}
    host = ["--lane", "cpu", "--hosts", "127.0.0.1", "--node-rank", "0", "--nproc-per-node", "4",
            "--coordinator", f"127.0.0.1:{free_port()}", "--max-restarts", "1"]  # fmt: skip
    command = [str(bin_dir / "titanpod-pretrain"), *RUN, "--output.run-name", name]
    argv = [str(bin_dir / "titanpod-launch"), *host, "--", *command]
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rank_pid(marker: str, rank: int) -> int | None:
    """The pid of the worker of this test's job with global rank ``rank``, read from /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        wanted = {f"FAULT_MARKER={marker}".encode(), f"RANK={rank}".encode(), b"TORCHELASTIC_RESTART_COUNT=0"}
        if wanted <= environ:
            return int(entry.name)
    return None


def rows(run_dir: Path) -> list[dict]:
    """The step rows of ``metrics.jsonl``."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "loss" in row]


@pytest.mark.slow
def test_a_killed_rank_restarts_the_job_which_resumes_and_matches_an_uninterrupted_run(tmp_path):
    marker = f"lost-rank-{os.getpid()}"
    job = launch(tmp_path, "killed", marker)
    metrics = tmp_path / "runs" / "killed" / "metrics.jsonl"
    killed = None
    deadline = time.monotonic() + 500
    while job.poll() is None and time.monotonic() < deadline:
        if killed is None and metrics.exists() and len(metrics.read_text().splitlines()) >= KILL_AFTER:
            killed = rank_pid(marker, 2)
            assert killed is not None
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.05)
    out, err = job.communicate(timeout=60)
    assert killed is not None, "the run ended before rank 2 could be killed"
    assert job.returncode == 0, err[-4000:]
    assert "titanpod: the job lost rank 2 of 4 ranks" in err, err[-4000:]
    assert "newest complete checkpoint runs/killed/checkpoints/step-0000" in err
    assert "resumed from runs/killed/checkpoints/step-0000" in out

    whole = launch(tmp_path, "whole", f"{marker}-whole")
    out, err = whole.communicate(timeout=500)
    assert whole.returncode == 0, err[-4000:]
    got, want = rows(tmp_path / "runs" / "killed"), rows(tmp_path / "runs" / "whole")
    assert [row["step"] for row in got] == [row["step"] for row in want] == list(range(1, STEPS + 1))
    for mine, theirs in zip(got, want, strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-6), mine["step"]
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-5), mine["step"]


def test_a_job_that_restarts_itself_must_name_its_run(monkeypatch):
    from titanpod.recipes.registry import get_recipe
    from titanpod.runs.session_dir import run_dir_of

    recipe = get_recipe("llama3_debug")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    with pytest.raises(ValueError, match=r"name the run with --output\.run-name NAME"):
        run_dir_of(recipe)
    named = dataclasses.replace(recipe, output=dataclasses.replace(recipe.output, run_name="pod"))
    assert run_dir_of(named).name == "pod"
