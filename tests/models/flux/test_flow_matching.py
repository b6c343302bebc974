"""Rectified-flow pieces against values worked by hand."""

import math

import pytest
import torch

from titanpod.models.flux.flow_matching import (
    euler_sample,
    flow_matching_loss,
    image_position_ids,
    noisy_latents,
    pack_latents,
    sample_timesteps,
    sampling_schedule,
    shift_mu,
    shift_timesteps,
    unpack_latents,
)


def test_shift_exponent_is_linear_in_image_tokens():
    assert shift_mu(256) == pytest.approx(0.5)
    assert shift_mu(4096) == pytest.approx(1.15)
    assert shift_mu(1024) == pytest.approx(0.5 + 0.65 * 768 / 3840)  # = 0.63


def test_timestep_shift_by_hand():
    # mu = ln 3: 3 / (3 + 1/0.5 - 1) = 0.75; mu = ln 2: 2 / (2 + 1/0.25 - 1) = 0.4
    assert shift_timesteps(torch.tensor([0.5]), math.log(3)).item() == pytest.approx(0.75)
    assert shift_timesteps(torch.tensor([0.25]), math.log(2)).item() == pytest.approx(0.4)
    ends = shift_timesteps(torch.tensor([0.0, 1.0]), 1.15)
    assert ends.tolist() == [0.0, 1.0]


def test_noisy_latents_and_loss_by_hand():
    x0, noise = torch.full((1, 2, 4), 1.0), torch.full((1, 2, 4), 3.0)
    assert noisy_latents(x0, noise, torch.tensor([0.25])).unique().item() == pytest.approx(1.5)  # 0.75 + 0.75
    assert flow_matching_loss(torch.full_like(x0, 2.0), x0, noise).item() == 0.0  # target e - x0 = 2
    assert flow_matching_loss(torch.zeros_like(x0), x0, noise).item() == pytest.approx(4.0)
    velocity = torch.tensor([[[0.0, 1.0], [2.0, 4.0]]])  # targets 2: errors 4, 1, 0, 4 -> mean 2.25
    assert flow_matching_loss(velocity, torch.ones(1, 2, 2), torch.full((1, 2, 2), 3.0)).item() == pytest.approx(2.25)


def test_packing_puts_each_2x2_patch_in_one_token_and_round_trips():
    latents = torch.arange(2 * 4 * 4, dtype=torch.float32).view(1, 2, 4, 4)
    tokens = pack_latents(latents)
    assert tokens.shape == (1, 4, 8)
    # first token: channel 0 patch (0, 1, 4, 5), then channel 1 patch (16, 17, 20, 21)
    assert tokens[0, 0].tolist() == [0, 1, 4, 5, 16, 17, 20, 21]
    assert unpack_latents(tokens, 4, 4).equal(latents)
    assert image_position_ids(4, 6).tolist()[:4] == [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0]]
    with pytest.raises(ValueError, match="even"):
        pack_latents(torch.zeros(1, 1, 3, 4))


def test_training_timesteps_are_seeded_and_inside_the_unit_interval():
    a = sample_timesteps(1000, 1024, torch.Generator().manual_seed(0))
    b = sample_timesteps(1000, 1024, torch.Generator().manual_seed(0))
    assert a.equal(b) and a.min() > 0 and a.max() < 1
    plain = sample_timesteps(1000, 1024, torch.Generator().manual_seed(0), shift=False)
    assert a.mean() > plain.mean()  # the shift moves timesteps towards noise


def test_euler_sampler_integrates_a_constant_velocity_exactly():
    schedule = sampling_schedule(7, 256)
    assert schedule[0] == 1.0 and schedule[-1] == 0.0 and (schedule[:-1] > schedule[1:]).all()
    noise = torch.randn(2, 3, 4)
    target = torch.randn(2, 3, 4)
    # with velocity e - x0 fixed, walking from t=1 to t=0 lands on x0 = noise - velocity
    out = euler_sample(lambda x, t: noise - target, noise, schedule)
    torch.testing.assert_close(out, target, atol=1e-5, rtol=0)
