"""Each process of a host drives its own device: a pretraining run started as local rank r (torchrun's
``LOCAL_RANK``) puts its parameters and batches on device r, waits for device r and reports device r's memory.

The host is simulated: a CPU backend standing for four chips records which chip each request names, while the
tensors themselves stay on the CPU.
"""

from __future__ import annotations

import pytest
import torch

import titanpod.runs.pretrain
from titanpod.device.backends.cpu import CpuBackend
from titanpod.device.memory import MemoryStats, host_memory_stats
from titanpod.pretrain.command import parse_recipe
from titanpod.runs import run_pretraining

CHIPS_PER_HOST = 4
"""Chips of the simulated host (a TPU v5p host: one process per chip)."""

TINY = [
    "--recipe", "llama3_debug", "--device.lane", "cpu", "--train.steps", "2", "--train.warmup-steps", "1",
    "--train.log-every", "1", "--data.seq-len", "16", "--data.batch-size", "2",
    "--data.validation-fraction", "0.1", "--data.validation-batches", "1", "--data.validation-every", "2",
    "--output.save-weights", "False", "--checkpoint.at-end", "False", "--output.tensorboard", "False",
]  # fmt: skip


class FourChipHost(CpuBackend):
    """A CPU backend that stands for a host of four chips: every request that names a chip is recorded as
    ``(what, local rank)``; the tensors stay on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, int]] = []

    def device(self, local_rank: int = 0) -> torch.device:
        """The host, recording the chip asked for."""
        self.requests.append(("device", local_rank))
        return torch.device("cpu")

    def device_count(self) -> int:
        """The simulated host's chips."""
        return CHIPS_PER_HOST

    def parameter_device(self, local_rank: int = 0) -> torch.device:
        """Where parameters go, recording the chip."""
        self.requests.append(("parameters", local_rank))
        return super().parameter_device(local_rank)

    def place_batch(self, tensor: torch.Tensor, local_rank: int = 0) -> torch.Tensor:
        """A batch tensor on the host, recording the chip."""
        self.requests.append(("batch", local_rank))
        return tensor.to(self.device(local_rank))

    def synchronize(self, local_rank: int = 0) -> None:
        """Nothing to wait for; records the chip."""
        self.requests.append(("synchronize", local_rank))

    def memory_stats(self, local_rank: int = 0) -> MemoryStats:
        """The host's memory, recording the chip."""
        self.requests.append(("memory", local_rank))
        return host_memory_stats()

    def chips_asked_for(self, what: str) -> set[int]:
        """The local ranks named by the requests of one kind."""
        return {rank for kind, rank in self.requests if kind == what}


@pytest.mark.parametrize("local_rank", range(CHIPS_PER_HOST))
def test_a_run_uses_the_device_of_its_local_rank_for_everything(local_rank, tmp_path, monkeypatch):
    host = FourChipHost()
    monkeypatch.setattr(titanpod.runs.pretrain, "get_backend", lambda lane: host)
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    recipe = parse_recipe([*TINY, "--output.runs-dir", str(tmp_path), "--output.run-name", "run"])
    assert recipe is not None
    result = run_pretraining(recipe)
    assert result.summary.steps_done == 2
    for what in ("parameters", "batch", "synchronize", "memory"):
        assert host.chips_asked_for(what) == {local_rank}, what
    assert {rank for _, rank in host.requests} == {local_rank}
