"""GRPO sharded under torchrun (FSDP over 2 gloo processes) equals one process: each data rank samples its
block of a step's prompts (seeds by step and prompt, not by rank), so the completions are the same, and the
loss is the step-wide token mean however the step is split. Each rank reads only part of the SFT folder, and its
engine receives the weights one gathered tensor at a time, never a whole copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.parallel.test_torchrun import free_port
from tests.rl.test_grpo_run import sft_folder  # noqa: F401  (a fixture)
from titanpod.checkpoint import load_model

WORKER = Path(__file__).with_name("grpo_worker.py")


def run_worker(tmp_path: Path, folder: Path, name: str, *args: str, processes: int = 1) -> dict:
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(processes),
                     "--master-addr", "127.0.0.1", "--master-port", str(free_port())]  # fmt: skip
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    out = tmp_path / f"{name}.json"
    command = [*launcher, str(WORKER), "--init-from", str(folder), "--runs-dir", str(tmp_path / "runs"),
               "--run-name", name, "--out", str(out), *args]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-8000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_fsdp2_on_two_processes_equals_one_process(tmp_path, sft_folder):  # noqa: F811
    one = run_worker(tmp_path, sft_folder, "one")
    two = run_worker(tmp_path, sft_folder, "two", "--fsdp", "2", "--meter", processes=2)
    assert len(one["steps"]) == len(two["steps"]) == 5
    for got, want in zip(two["steps"], one["steps"], strict=True):
        # The same completions on both launches: rollout figures agree (rewards summed in another order).
        for key in ("samples", "completion_length", "version"):
            assert got[key] == want[key], key
        assert got["reward_mean"] == pytest.approx(want["reward_mean"], rel=1e-12)
        for key in ("loss", "kl", "clip"):
            assert abs(got[key] - want[key]) <= 1e-5 * abs(want[key]) + 1e-7, (key, got[key], want[key])
    assert any(abs(step["loss"]) > 1e-3 for step in one["steps"])  # the losses compared are not all zero
    _, sharded = load_model(Path(two["weights"]).parent)
    _, whole = load_model(Path(one["weights"]).parent)
    for (name, a), b in zip(sharded.state_dict().items(), whole.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4, msg=name)
    # Sharded loading and streamed syncs: each rank read less than the whole fp32 policy (the two together read
    # all of it), and no sync held more than the largest single weight's gathered bytes.
    params = list(whole.parameters())
    whole_fp32 = sum(p.numel() for p in params) * 4
    largest_fp32 = max(p.numel() for p in params) * 4
    ranks = [json.loads((tmp_path / f"two.rank{rank}.json").read_text()) for rank in (0, 1)]
    policy_reads = [rank["bytes_read"][0] for rank in ranks]  # the policy's reader (the KL reference's is second)
    assert all(0 < read < whole_fp32 for read in policy_reads), (policy_reads, whole_fp32)
    assert sum(policy_reads) >= whole_fp32
    assert all(0 < rank["sync_peak_bytes"] <= largest_fp32 < whole_fp32 for rank in ranks), ranks
