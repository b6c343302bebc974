"""Splash attention and the Pallas loss in the whole step of a model sharded by the torch executor.

Real processes (torchrun, gloo, 4 ranks; ``tests/parallel/train_worker.py``): the llama3
debug model, 10 steps of 8 sequences of 128 tokens from the built-in corpus, fp32, with
Splash and the Pallas loss, the whole step captured and run op by op; per-step losses
(averaged over the data ranks) against one process training eagerly on the whole batch
with the same kernels, within 1e-5 relative (measured 5e-7). Under tp the kernels see
this rank's heads (attention) and the whole sequence gathered back (head and loss).
"""

from __future__ import annotations

import pytest

from tests.parallel.test_torchrun import run_worker

KERNELS = ["--family", "llama3", "--seq-len", "128", "--attention", "splash", "--head-loss", "pallas"]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> list[float]:
    return run_worker(tmp_path_factory.mktemp("eager") / "losses.json", *KERNELS)["losses"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--fsdp", "4"], ["--fsdp", "2", "--tp", "2"]], ids=["fsdp4", "fsdp2_tp2"])
def test_whole_step_with_kernels_sharded_equals_single_process(layout, single_process, tmp_path):
    sharded = run_worker(tmp_path / "losses.json", *KERNELS, *layout, "--step-mode", "whole_step", processes=4)
    assert len(sharded["losses"]) == len(single_process) == 10
    assert single_process[-1] < single_process[0]  # it learns
    for step, (got, want) in enumerate(zip(sharded["losses"], single_process, strict=True), 1):
        assert abs(got - want) <= 1e-5 * abs(want), f"step {step}: {got} vs {want}"
    assert sharded["graph_collectives"].get("reduce_scatter_tensor", 0) > 0  # the step holds the sharded reductions
