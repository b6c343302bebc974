"""What the chip tier's files that run each training in a process of its own share: the lane under test, the
attention the installed libtpu can run, and a logged run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.chip.conftest import ON_CPU

NATIVE_LANE = "cpu" if ON_CPU else "tpu"
"""The lane under test: the tpu lane on a chip, the cpu lane where the tests are checked on a CPU."""


def attention() -> str:
    """``math`` where torch_tpu's SDPA kernel cannot compile with the installed libtpu, else ``sdpa``."""
    if ON_CPU:
        return "math"
    from titanpod.device.backends.tpu import TpuBackend

    return "math" if TpuBackend.sdpa_problem() else "sdpa"


RUN_TIMEOUT_S = float(os.environ.get("TITANPOD_CHIP_RUN_TIMEOUT", "900"))
"""The longest one run may take before it counts as hung (``TITANPOD_CHIP_RUN_TIMEOUT`` seconds)."""


def run_logged(command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """Run ``command`` with its output appended to ``log`` as it goes (so a run cut short still shows where it was);
    fail the test on a non-zero exit or past ``RUN_TIMEOUT_S``, with the log's end."""
    with log.open("a") as sink:
        sink.write(f"$ {' '.join(command)}\n")
        sink.flush()
        try:
            code = subprocess.run(
                command, stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=RUN_TIMEOUT_S
            ).returncode
        except subprocess.TimeoutExpired:
            code = f"none: still running after {RUN_TIMEOUT_S:.0f} s"
    assert code == 0, f"{log.stem}: exit {code}\n{log.read_text()[-4000:]}"


def stopped_by_sigterm(
    command: list[str], log: Path, metrics: Path, after_step: int, env: dict[str, str] | None = None
):
    """Start ``command``, send it SIGTERM once ``metrics`` (its metrics.jsonl) holds a row of a step at or past
    ``after_step``, as a preempted VM's shutdown does, and return its exit code (143 when it stopped saving) and the
    seconds from the signal to its exit. Fails the test past ``RUN_TIMEOUT_S``."""
    import json
    import signal
    import time

    def reached() -> bool:
        if not metrics.is_file():
            return False
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip().endswith("}")]
        return any(row.get("step", 0) >= after_step and "loss" in row for row in rows)

    with log.open("a") as sink:
        sink.write(f"$ {' '.join(command)}  (SIGTERM after step {after_step})\n")
        sink.flush()
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while process.poll() is None and not reached():
            assert time.monotonic() < deadline, f"{log.stem}: step {after_step} not reached in {RUN_TIMEOUT_S:.0f} s"
            time.sleep(0.2)
        assert process.poll() is None, (
            f"{log.stem}: exit {process.returncode} before the signal\n{log.read_text()[-4000:]}"
        )
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=RUN_TIMEOUT_S)
        return code, time.monotonic() - sent


def record(runs: Path, key: str, value: object) -> None:
    """Keep a measured figure in ``report.json`` beside the runs."""
    path = runs / "report.json"
    report = json.loads(path.read_text()) if path.is_file() else {}
    report[key] = value
    path.write_text(json.dumps(report, indent=2) + "\n")


def same_weights(a: Path, b: Path) -> bool:
    """Whether two runs' final weights (``model/model.safetensors``) are equal, name for name, bit for bit."""
    from safetensors.torch import load_file

    ours, theirs = load_file(a / "model" / "model.safetensors"), load_file(b / "model" / "model.safetensors")
    return ours.keys() == theirs.keys() and all(ours[key].equal(theirs[key]) for key in ours)
