"""AdamW as one JAX program (``titanpod.graph.adamw_program``), where the lane asks for it (the tpu lane: each eager
op there is a dispatch of its own).

Off a TPU the program is ``jax.jit`` on JAX's CPU, so everything but torch_tpu's op and its donation runs here:
the rule against ``adamw_update_``'s (fp32: 1e-6 relative, a few units in the last place from the two libraries'
own rounding), the tensors keeping their identity while taking new buffers, and whole training runs, eager and
whole step (with the update after the program), against the same runs updated op by op: losses to 1e-6 relative,
parameters to 5e-6 after 10 steps.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.graph.test_step_modes import (
    PoisonedLoss,
    batches_with_poison_at,
    max_param_difference,
    one_batch_repeated,
    tiny_model,
)
from titanpod.device.backends.cpu import CpuBackend
from titanpod.graph import TrainConfig, train
from titanpod.graph.adamw_program import AdamWProgram, program_name
from titanpod.graph.optimizer import adamw_update_, init_adamw_state, weight_decays


class OneProgramCpu(CpuBackend):
    """The cpu lane, updating as the tpu lane does: AdamW as one program."""

    update_as_one_program = True


def tensors(seed: int) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(8, 16), (16,), (4, 4, 3)]
    params = [torch.randn(shape, generator=generator) for shape in shapes]
    grads = [[torch.randn(shape, generator=generator) for shape in shapes] for _ in range(4)]
    return params, grads


@pytest.mark.parametrize("grad_clip", [0.0, 0.5])
def test_the_program_applies_adamw_update_s_rule_skipping_a_step_whose_norm_is_not_finite(grad_clip):
    config = TrainConfig(grad_clip=grad_clip, weight_decay=0.1)
    start, grads = tensors(0)
    decays = weight_decays(start, config)
    assert sorted(set(decays)) == [0.0, 0.1]
    reference = [p.clone() for p in start]
    program_params = [p.clone() for p in start]
    reference_state, program_state = init_adamw_state(reference), init_adamw_state(program_params)
    program = AdamWProgram(config, decays)
    for index, step_grads in enumerate(grads):
        norm = torch.tensor(math.nan if index == 2 else 1.5 + index)
        lr = torch.tensor(1e-2 * (index + 1))
        expected = adamw_update_(reference, step_grads, reference_state, lr, norm, decays, config, "per_tensor")
        applied = program(program_params, step_grads, program_state, lr, norm)
        assert bool(applied) == bool(expected) == (index != 2)
    assert float(program_state.step) == float(reference_state.step) == 3.0
    pairs = [
        *zip(program_params, reference, strict=True),
        *zip(program_state.exp_avg, reference_state.exp_avg, strict=True),
        *zip(program_state.exp_avg_sq, reference_state.exp_avg_sq, strict=True),
    ]
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)
    assert max((p - s).abs().max().item() for p, s in zip(program_params, start, strict=True)) > 1e-3


def test_each_tensor_keeps_its_identity_and_takes_the_new_value():
    layer = nn.Linear(4, 3)
    params = list(layer.parameters())
    before = [p.detach().clone() for p in params]
    stale_alias = params[0].detach()  # shares the old buffer; a caller must make such aliases afresh
    state = init_adamw_state(params)
    moments = [*state.exp_avg, *state.exp_avg_sq]
    config = TrainConfig()
    program = AdamWProgram(config, weight_decays(params, config))
    with torch.no_grad():
        applied = program(params, [torch.ones_like(p) for p in params], state, torch.tensor(0.1), torch.tensor(1.0))
    assert bool(applied)
    assert list(layer.parameters()) == params and all(isinstance(p, nn.Parameter) for p in params)
    assert [*state.exp_avg, *state.exp_avg_sq] == moments  # the same objects, new values
    assert all(not torch.equal(p.detach(), b) for p, b in zip(params, before, strict=True))
    assert torch.equal(stale_alias, before[0])
    assert all(m.abs().sum() > 0 for m in moments)


def test_a_program_is_named_by_everything_its_rule_holds():
    decays = [0.1, 0.0]
    assert program_name(TrainConfig(), decays) == program_name(TrainConfig(), decays)
    assert program_name(TrainConfig(), decays) != program_name(TrainConfig(), [0.0, 0.1])
    assert program_name(TrainConfig(), decays) != program_name(TrainConfig(beta2=0.99), decays)
    assert program_name(TrainConfig(), decays).startswith("titanpod::adamw_program_")


def train_both(mode: str, **overrides):
    config = TrainConfig(**{"steps": 10, "warmup_steps": 2, "log_every": 5, "step_mode": mode, **overrides})
    op_by_op, one_program = tiny_model(), tiny_model()
    expected = train(op_by_op, one_batch_repeated(64), config, CpuBackend(), flops_per_token=1.0)
    got = train(one_program, one_batch_repeated(64), config, OneProgramCpu(), flops_per_token=1.0)
    return expected, got, max_param_difference(one_program, op_by_op)


@pytest.mark.parametrize(
    "mode, overrides",
    [("eager", {}), ("whole_step", {"compiler": "none", "whole_step_update": "after_program"})],
)
def test_a_run_updated_as_one_program_trains_like_one_updated_op_by_op(mode, overrides):
    expected, got, difference = train_both(mode, **overrides)
    assert got.losses == pytest.approx(expected.losses, rel=1e-6)
    assert expected.losses[-1] < expected.losses[0]
    assert difference < 5e-6


def test_a_nan_step_is_skipped_by_the_program_too():
    constant = {"steps": 5, "warmup_steps": 0, "decay": "constant", "log_every": 5, "step_mode": "eager"}
    poisoned, clean = PoisonedLoss(), PoisonedLoss()
    summary = train(poisoned, batches_with_poison_at(2), TrainConfig(**constant), OneProgramCpu(), flops_per_token=1.0)
    reference = train(
        clean, batches_with_poison_at(None), TrainConfig(**{**constant, "steps": 4}), CpuBackend(), flops_per_token=1.0
    )
    assert summary.skipped_steps == [3]
    assert summary.losses[:2] + summary.losses[3:] == pytest.approx(reference.losses, rel=1e-6)
    assert max_param_difference(poisoned, clean) < 5e-6
