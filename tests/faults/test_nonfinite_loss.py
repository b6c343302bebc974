"""The NaN stop reads the loss as well as the gradient norm: a NaN loss whose gradients are finite (the update
goes through) still stops a run that asked to stop on non-finite values."""

from __future__ import annotations

import math

import torch
from torch import nn

from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train


class NanLoss(nn.Module):
    """A loss of NaN whose gradient is finite: the NaN is a constant added after the parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (self.weight * inputs).sum() + torch.tensor(math.nan)


def test_a_nan_loss_with_a_finite_gradient_stops_the_run(tmp_path):
    config = TrainConfig(steps=5, lr=0.01, warmup_steps=0, log_every=5, skip_nonfinite=False)
    batches = iter(lambda: {"inputs": torch.ones(2, 4), "targets": torch.zeros(2)}, None)
    summary = train(NanLoss(), batches, config, get_backend("cpu"), flops_per_token=1.0, count_tokens=lambda _: 2)
    assert summary.steps_done == 1
    assert summary.stopped_because is not None
    assert summary.stopped_because.startswith("step 1: the loss is nan (gradient norm 4.0)")
    assert "train.skip_nonfinite" in summary.stopped_because
