"""Sharded training on real processes (torchrun, gloo) equals single-process training.

Each case trains a debug model for 10 steps on the built-in corpus, with the global batch
split over the data-parallel ranks, and compares per-step losses (averaged over the data
ranks) with one process training on the whole batch: fp32, within 1e-5 relative.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("train_worker.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_worker(out: Path, *args: str, processes: int = 1) -> dict:
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(processes),
                     "--master-addr", "127.0.0.1", "--master-port", str(free_port())]  # fmt: skip
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*launcher, str(WORKER), *args, "--out", str(out)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    folder = tmp_path_factory.mktemp("single")
    return {family: run_worker(folder / f"{family}.json", "--family", family) for family in ("llama3", "qwen3_moe")}


CASES = {
    "fsdp4": ("llama3", ["--fsdp", "4"], 4),
    "fsdp2_tp2": ("llama3", ["--fsdp", "2", "--tp", "2"], 4),  # with sequence parallelism
    "hsdp2x2": ("llama3", ["--dp-replicate", "2", "--fsdp", "2"], 4),
    "ep2_fsdp2": ("qwen3_moe", ["--fsdp", "2", "--ep", "2"], 4),
    "tp2_no_sequence_parallel": ("llama3", ["--fsdp", "1", "--tp", "2", "--no-sequence-parallel"], 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_sharded_losses_equal_single_process(case, single_process, tmp_path):
    family, args, processes = CASES[case]
    sharded = run_worker(tmp_path / "losses.json", "--family", family, *args, processes=processes)
    reference = single_process[family]["losses"]
    assert len(sharded["losses"]) == len(reference) == 10
    for step, (got, want) in enumerate(zip(sharded["losses"], reference, strict=True), 1):
        assert abs(got - want) <= 1e-5 * abs(want), f"step {step}: {got} vs {want}"
    assert reference[-1] < reference[0]  # it learns
    if case == "fsdp4":
        assert sharded["param_bytes"] * 4 == sharded["full_bytes"]
