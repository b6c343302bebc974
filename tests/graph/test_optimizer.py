"""The functional AdamW (fused and per tensor) against torch.optim.AdamW with clip_grad_norm_; its NaN/Inf guard."""

import pytest
import torch

from titanpod.graph import TrainConfig, adamw_update_, init_adamw_state, total_grad_norm
from titanpod.graph.optimizer import can_fuse

CONFIG = TrainConfig(weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0)


def random_params(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in ((8, 4), (4,), (3, 5, 2))]


IMPLEMENTATIONS = pytest.mark.parametrize("implementation", ["fused", "per_tensor"])


@IMPLEMENTATIONS
def test_matches_torch_adamw_with_clipping_over_several_steps(implementation):
    ours = random_params(0)
    theirs = [p.clone().requires_grad_(True) for p in ours]
    decays = [0.1, 0.0, 0.1]
    reference = torch.optim.AdamW(
        [{"params": [theirs[0], theirs[2]], "weight_decay": 0.1}, {"params": [theirs[1]], "weight_decay": 0.0}],
        lr=1e-2,
        betas=(0.9, 0.95),
        eps=1e-8,
        foreach=False,
    )
    state = init_adamw_state(ours)
    generator = torch.Generator().manual_seed(1)
    for step in range(5):
        grads = [torch.randn(p.shape, generator=generator) * (3.0 if step % 2 else 0.1) for p in ours]
        lr = 1e-2 * (step + 1) / 5
        for group in reference.param_groups:
            group["lr"] = lr
        for param, grad in zip(theirs, grads, strict=True):
            param.grad = grad.clone()
        expected_norm = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        reference.step()
        norm = total_grad_norm(grads)
        applied = adamw_update_(ours, grads, state, torch.tensor(lr), norm, decays, CONFIG, implementation)
        assert bool(applied)
        assert float(norm) == pytest.approx(float(expected_norm), rel=1e-6)
        for mine, want in zip(ours, theirs, strict=True):
            torch.testing.assert_close(mine, want.detach(), rtol=1e-6, atol=1e-7)  # fp32 rounding
    assert float(state.step) == 5


@IMPLEMENTATIONS
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_norm_changes_nothing(bad, implementation):
    params = random_params(2)
    state = init_adamw_state(params)
    grads = [torch.ones_like(p) for p in params]
    adamw_update_(params, grads, state, torch.tensor(1e-2), total_grad_norm(grads), [0.1] * 3, CONFIG)
    before = [t.clone() for t in [*params, *state.exp_avg, *state.exp_avg_sq, state.step]]
    grads[1][0] = bad
    norm = total_grad_norm(grads)
    applied = adamw_update_(params, grads, state, torch.tensor(1e-2), norm, [0.1] * 3, CONFIG, implementation)
    assert not bool(applied)
    after = [*params, *state.exp_avg, *state.exp_avg_sq, state.step]
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old, new)


def test_fused_where_the_kernel_takes_the_tensors():
    params = random_params(3)
    assert can_fuse(params)
    assert not can_fuse([*params, params[0].bfloat16()])  # the fused kernel wants one dtype: bf16 goes per tensor
    assert not can_fuse([torch.zeros(2, device="meta")])


def test_fused_update_of_a_transposed_gradient_matches_the_per_tensor_one():
    """torch's CPU fused AdamW reads every tensor as contiguous; a backward can hand it a transposed
    gradient (a captured step does), which must give the update of the same values laid out plainly."""
    params = {name: random_params(4) for name in ("fused", "per_tensor")}
    states = {name: init_adamw_state(ps) for name, ps in params.items()}
    generator = torch.Generator().manual_seed(5)
    grads = [torch.randn(tuple(reversed(p.shape)), generator=generator).permute(*reversed(range(p.ndim))) for p in
             params["fused"]]  # fmt: skip
    assert not grads[0].is_contiguous()
    for name in ("fused", "per_tensor"):
        norm = total_grad_norm(grads)
        adamw_update_(params[name], grads, states[name], torch.tensor(1e-2), norm, [0.1] * 3, CONFIG, name)
    for fused, plain in zip(params["fused"], params["per_tensor"], strict=True):
        torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-7)
