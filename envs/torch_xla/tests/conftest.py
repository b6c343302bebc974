"""Shared set-up of the torch_xla lane's tests: PJRT on the host CPU, and training runs started as a user does.

Each run is its own process: torch_xla's SPMD mode, once on, stays on for the process, and the host's
PJRT device count (``CPU_NUM_DEVICES``) is read once, at the runtime's start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")

SMALL = ["--train.steps", "10", "--train.log-every", "1", "--data.batch-size", "4", "--data.seq-len", "64"]
"""Ten steps of a debug recipe at a size that runs in seconds; a report (a loss) every step."""


def train(runs: Path, name: str, *args: str, devices: int = 1) -> subprocess.CompletedProcess[str]:
    """``titanpod-pretrain --output.run-name name *args`` in a fresh process with ``devices`` host PJRT devices."""
    env = {
        **os.environ,
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": str(devices),
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "COLUMNS": "200",
    }
    command = [sys.executable, "-m", "titanpod.pretrain.cli", "--output.runs-dir", str(runs), "--output.run-name", name]
    done = subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def losses(runs: Path, name: str) -> dict[int, float]:
    """Step -> loss from the run's metrics.jsonl (a report per step)."""
    lines = (runs / name / "metrics.jsonl").read_text().splitlines()
    return {record["step"]: record["loss"] for record in map(json.loads, lines)}


def assert_close(got: dict[int, float], want: dict[int, float], rel: float = 1e-5) -> None:
    """The same steps, each loss within ``rel`` of the reference's."""
    assert sorted(got) == sorted(want)
    worst = max(abs(got[step] - want[step]) / abs(want[step]) for step in want)
    assert worst <= rel, f"largest relative difference {worst:.2e} > {rel:.0e}: {got} vs {want}"


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for every run of the session (the cpu references are shared by several tests)."""
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def cpu_reference(runs: Path):
    """Losses of the cpu lane's run of a recipe (eager, fp32), made once per recipe."""
    made: dict[str, dict[int, float]] = {}

    def reference(recipe: str) -> dict[int, float]:
        if recipe not in made:
            train(runs, f"cpu-{recipe}", "--recipe", recipe, "--device.lane", "cpu", *SMALL)
            made[recipe] = losses(runs, f"cpu-{recipe}")
        return made[recipe]

    return reference
