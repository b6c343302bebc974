"""The GRPO loss functions against values worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from titanpod.rl.grpo.loss import clipped_policy_loss, group_advantages, kl_penalty


def test_group_advantages_by_hand():
    # group 0: [1, 0, 0, 0]: mean 0.25, population std sqrt(0.25 * 0.75) = 0.4330
    # group 1: [1, 1, 0, 0]: mean 0.5, std 0.5 -> +-1
    advantages = group_advantages([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]], eps=0.0)
    std = math.sqrt(0.25 * 0.75)
    expected = torch.tensor([[0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std], [1.0, 1.0, -1.0, -1.0]])
    torch.testing.assert_close(advantages, expected)


def test_group_advantages_equal_rewards_are_zero():
    # 0.1 is not exact in binary: a mean of three 0.1s differs from 0.1 by rounding; still exactly 0.
    advantages = group_advantages(torch.tensor([[0.1, 0.1, 0.1], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(advantages, torch.zeros(3, 3))


def test_group_advantages_eps_and_single_sample():
    torch.testing.assert_close(group_advantages([[2.0, 0.0]], eps=1.0), torch.tensor([[0.5, -0.5]]))
    assert torch.equal(group_advantages([[3.0]]), torch.zeros(1, 1))


def test_empty_group_names_the_prompt():
    with pytest.raises(ValueError, match="Prompt 1 has an empty group"):
        group_advantages([[1.0, 0.0], []])
    with pytest.raises(ValueError, match="empty group"):
        group_advantages(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="different sizes"):
        group_advantages([[1.0, 0.0], [1.0]])


def _log(values):
    return torch.log(torch.tensor(values, dtype=torch.float32))


def test_clipped_loss_by_hand():
    # Four sequences of one token, old logprob log(1) = 0, so the ratio is exp(new) = the given value.
    # seq 0: ratio 1.5, A +1 -> clipped to 1.2: objective 1.2 (clip took effect)
    # seq 1: ratio 0.5, A -1 -> clipped to 0.8: min(-0.5, -0.8) = -0.8 (clip took effect)
    # seq 2: ratio 0.5, A +1 -> min(0.5, 0.8) = 0.5 (unclipped)
    # seq 3: ratio 1.1, A -2 -> inside [0.8, 1.2]: -2.2
    new = _log([[1.5], [0.5], [0.5], [1.1]])
    old = torch.zeros(4, 1)
    advantages = torch.tensor([1.0, -1.0, 1.0, -2.0])
    loss, clip_fraction = clipped_policy_loss(new, old, advantages, torch.ones(4, 1), clip_eps=0.2)
    torch.testing.assert_close(loss, torch.tensor(-(1.2 - 0.8 + 0.5 - 2.2) / 4))
    torch.testing.assert_close(clip_fraction, torch.tensor(0.5))


def test_clipped_loss_gradient_is_zero_where_clipped():
    new = _log([[1.5, 1.0]]).requires_grad_(True)
    loss, clip_fraction = clipped_policy_loss(new, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
    loss.backward()
    # token 0 clipped: no gradient; token 1 ratio 1: d(-ratio * A / 2)/d new = -exp(0) / 2
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, -0.5]]))
    torch.testing.assert_close(clip_fraction, torch.tensor(0.5))


def test_loss_is_a_token_mean_over_the_batch():
    # sequence 0 has 3 completion tokens, sequence 1 has 1 (the rest masked, holding garbage values).
    # ratio 1 everywhere: objective per token = A. Token mean: (3 * 1 + 1 * (-1)) / 4 = 0.5 -> loss -0.5.
    # (A per-sequence mean first would give (1 - 1) / 2 = 0.)
    new = torch.tensor([[0.0, 0.0, 0.0], [0.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, clip_fraction = clipped_policy_loss(new, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask)
    torch.testing.assert_close(loss, torch.tensor(-0.5))
    assert clip_fraction.item() == 0.0


def test_loss_of_empty_mask_is_zero_and_shapes_are_checked():
    loss, _ = clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3))
    assert loss.item() == 0.0
    with pytest.raises(ValueError, match="advantages"):
        clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="logprobs_old"):
        clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2), torch.ones(2, 3))


def test_kl_k3_by_hand():
    same = torch.tensor([[-1.0, -2.0]])
    assert kl_penalty(same, same, torch.ones(1, 2)).item() == 0.0
    # ref - new = 1 on token 0: e - 1 - 1 = e - 2; ref - new = -1 on token 1: 1/e + 1 - 1 = 1/e; mean of both
    new, ref = torch.tensor([[-2.0, -1.0, 5.0]]), torch.tensor([[-1.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(kl_penalty(new, ref, mask), torch.tensor((math.e - 2 + 1 / math.e) / 2))
