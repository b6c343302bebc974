"""Starting a rehearsal's runs: torch.distributed.run for the torch executor, one process with host devices for xla."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from titanpod.recipes.rehearsal.scaling import REHEARSAL_LANES

TIMEOUT_SECONDS = 30 * 60
"""A run that takes longer than this is stopped and named (a hung collective would otherwise wait forever)."""
HOST_COLLECTIVE_WAIT_SECONDS = 10 * 60
"""How long XLA's CPU collectives wait for every host device's thread (its default, 40 s, aborts the process).
The host's devices share a few cores, and a device running an interpreted Pallas kernel can reach a collective
minutes after the others, so the wait is long; ``TIMEOUT_SECONDS`` still ends a run that truly hangs."""


@dataclass(frozen=True)
class Launch:
    """How one run ended."""

    command: list[str]
    """What was started."""
    returncode: int
    """Its exit status (124 after the timeout)."""
    seconds: float
    """Wall time."""
    log: Path
    """Everything it printed."""

    def tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines it printed."""
        return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_command(lane: str, recipe_file: Path, processes: int | None = None, runner: str = "pretrain") -> list[str]:
    """The command that trains ``recipe_file`` with ``runner`` (``pretrain`` or ``diffusion``) on ``lane`` (see
    ``REHEARSAL_LANES``): torch.distributed.run with the lane's processes (gloo on the cpu lane; ``processes``
    when given), or one process driving the lane's host devices (xla)."""
    worker = ["-m", "titanpod.runs.rehearsal.worker", str(recipe_file), runner]
    processes = processes or REHEARSAL_LANES[lane].processes
    if processes > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
                "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *worker]  # fmt: skip
    return [sys.executable, *worker]


def launch_environment(lane: str) -> dict[str, str]:
    """This process's environment, with what a rehearsal run of ``lane`` needs on this machine."""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    spec = REHEARSAL_LANES[lane]
    if spec.processes > 1:
        # Several ranks share this machine's cores: one thread each unless the user chose otherwise.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // spec.processes)))
    if spec.host_devices > 1:  # one controller drives this many JAX devices on the host's CPU
        env["JAX_PLATFORMS"] = "cpu"
        flags = (
            f"--xla_force_host_platform_device_count={spec.host_devices} "
            f"--xla_cpu_collective_call_terminate_timeout_seconds={HOST_COLLECTIVE_WAIT_SECONDS}"
        )
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
    return env


def _stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_logged(command: list[str], env: dict[str, str], log: Path, cwd: Path) -> Launch:
    """Run ``command``, writing everything it prints to ``log``; stopped after ``TIMEOUT_SECONDS``."""
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        # Its own process group, so that stopping it stops every rank torch.distributed.run started.
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
        try:
            code = process.wait(timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            _stop(process)
            out.write(f"\nstopped after {TIMEOUT_SECONDS} s\n")
            code = 124
        except BaseException:  # Ctrl-C: take the run down with us
            _stop(process)
            raise
    return Launch(command, code, time.monotonic() - start, log)
