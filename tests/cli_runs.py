"""Running an app's command line as a user does: one process, or several under torch.distributed.run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.parallel.test_torchrun import free_port


def run_cli(module: str, args: list[str], cwd: Path, processes: int = 1) -> subprocess.CompletedProcess[str]:
    """``python -m module *args`` in ``cwd`` (with ``processes`` > 1: under torchrun, gloo on the CPU),
    one thread per process and a wide console; its output captured."""
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(processes),
                     "--master-addr", "127.0.0.1", "--master-port", str(free_port())]  # fmt: skip
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run(
        [*launcher, "-m", module, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600, check=False
    )
