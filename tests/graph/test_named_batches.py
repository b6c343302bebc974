"""Models that take named tensors (a diffusion objective's batch) train through the same loop."""

import pytest
import torch
from torch import nn

from titanpod.device import get_backend
from titanpod.graph import TrainConfig, build_step, train


class Regression(nn.Module):
    """loss(**batch) of a linear map: a stand-in for any objective whose batch is named tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (weight[:, None] * (self.proj(inputs) - targets) ** 2).mean()


def batches(count: int):
    generator = torch.Generator().manual_seed(0)
    truth = torch.randn(4, 4, generator=generator)
    for _ in range(count):
        inputs = torch.randn(8, 4, generator=generator)
        yield {"inputs": inputs, "targets": inputs @ truth.T, "weight": torch.ones(8)}


def test_named_batches_train_with_a_token_count_of_their_own():
    torch.manual_seed(0)
    model = Regression()
    config = TrainConfig(steps=30, lr=0.05, warmup_steps=0, log_every=10, weight_decay=0.0)
    reports = []
    summary = train(
        model,
        batches(30),
        config,
        get_backend("cpu"),
        flops_per_token=1.0,
        count_tokens=lambda batch: batch["inputs"].shape[0],
        on_report=reports.append,
    )
    assert summary.steps_done == 30
    assert summary.losses[-1] < 0.1 * summary.losses[0]
    assert all(report.tokens_per_second > 0 for report in reports)


def test_named_batches_take_the_captured_whole_step_as_they_take_the_eager_one():
    config = {"steps": 5, "lr": 0.05, "warmup_steps": 0, "log_every": 5, "weight_decay": 0.0, "grad_accum_steps": 2}
    results = []
    for mode in ("eager", "whole_step"):
        torch.manual_seed(0)
        model = Regression()
        summary = train(
            model,
            batches(10),
            TrainConfig(step_mode=mode, compiler="none", **config),
            get_backend("cpu"),
            flops_per_token=1.0,
        )
        results.append((summary.losses, model.proj.weight.detach().clone()))
    (eager_losses, eager_weight), (whole_losses, whole_weight) = results
    assert len(whole_losses) == 5
    assert whole_losses == pytest.approx(eager_losses, rel=1e-6)  # the same ops in the same order: equal in fp32
    torch.testing.assert_close(whole_weight, eager_weight, rtol=1e-6, atol=0.0)


def test_micro_batches_of_one_step_must_name_the_same_tensors():
    step = build_step(Regression(), TrainConfig(step_mode="whole_step", compiler="none"), get_backend("cpu"))
    first, second = batches(2)
    del second["weight"]
    with pytest.raises(ValueError, match="name different tensors"):
        step([first, second], 0.01)
