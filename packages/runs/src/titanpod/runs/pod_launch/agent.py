"""Starting torchrun's elastic agent on this host, forwarding stop signals and its exit code."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from titanpod.runs.pod_launch.environment import LaunchEnvironment

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals the launcher passes on to the agent, which stops its workers in turn."""


def agent_command(
    launch: LaunchEnvironment, command: Sequence[str], log_dir: Path | None = None, max_restarts: int = 0
) -> list[str]:
    """``torchrun --nnodes ... --no-python command...`` for this host, with this interpreter's torch.

    torchrun gives each process ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``. With ``log_dir``, each
    process's output also goes to ``log_dir/node-<NODE_RANK>/<run>/attempt_<n>/<local rank>/``. With
    ``max_restarts`` N > 0, torchrun starts this host's processes again (up to N times) when any of them
    fails; the trainers resume from the run's newest complete checkpoint by themselves.
    """
    if max_restarts < 0:
        raise ValueError(f"--max-restarts is {max_restarts}: give 0 (no restarts) or more.")
    if not command:
        raise ValueError("No command to launch: give it after --, e.g. titanpod-launch -- titanpod-pretrain")
    argv = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(launch.nnodes), "--node-rank", str(launch.node_rank),
        "--nproc-per-node", str(launch.nproc_per_node),
        "--master-addr", launch.master_addr, "--master-port", str(launch.master_port),
    ]  # fmt: skip
    if max_restarts:
        argv += ["--max-restarts", str(max_restarts)]
    if log_dir is not None:
        argv += ["--log-dir", str(log_dir / f"node-{launch.node_rank}"), "--tee", "3"]
    return [*argv, "--no-python", *command]


def exit_code(returncode: int) -> int:
    """A shell's exit code for a child's return code: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def run_agent(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``argv`` to the end, passing SIGTERM and SIGINT on to it; its exit code."""
    child = subprocess.Popen(list(argv), env=dict(env))

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        return exit_code(child.wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
