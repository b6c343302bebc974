"""Rotary embeddings: rotate-half layout, relative-position property, Llama 3.1 scaling."""

import math

import torch

from titanpod.models.common.rope import (
    Llama3RopeScaling,
    apply_rotary,
    half_turn,
    inverse_frequencies,
    rotary_cos_sin,
)


def test_unscaled_frequencies_are_theta_powers():
    inv = inverse_frequencies(8, 10000.0)
    expected = torch.tensor([10000.0 ** (-i / 8) for i in (0, 2, 4, 6)])
    torch.testing.assert_close(inv, expected)


def test_scores_depend_only_on_relative_position():
    inv = inverse_frequencies(16, 500000.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(pos_q: int, pos_k: int) -> torch.Tensor:
        cos, sin = rotary_cos_sin(torch.tensor([pos_q, pos_k]), inv, torch.float32)
        rq = apply_rotary(q, cos[:1], sin[:1])
        rk = apply_rotary(k, cos[1:], sin[1:])
        return (rq * rk).sum()

    torch.testing.assert_close(score(5, 2), score(13, 10))
    torch.testing.assert_close(score(0, 0), (q * k).sum())


def test_llama31_scaling_keeps_high_and_divides_low_frequencies():
    scaling = Llama3RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
    )
    plain = inverse_frequencies(128, 500000.0)
    scaled = inverse_frequencies(128, 500000.0, scaling)
    wavelength = 2 * math.pi / plain
    high = wavelength < 8192 / 4
    low = wavelength > 8192 / 1
    torch.testing.assert_close(scaled[high], plain[high])
    torch.testing.assert_close(scaled[low], plain[low] / 8)
    middle = ~(high | low)
    assert middle.any()
    assert torch.all(scaled[middle] < plain[middle]) and torch.all(scaled[middle] > plain[middle] / 8)


def test_the_pairs_swap_as_a_product_is_the_concatenation_of_halves_bit_for_bit_forward_and_backward():
    small = torch.randn(3, 8)
    assert torch.equal(small @ half_turn(8, torch.float32, small.device), torch.cat((-small[:, 4:], small[:, :4]), -1))
    inv = inverse_frequencies(128, 1_000_000.0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        cos, sin = rotary_cos_sin(torch.arange(64), inv, dtype)
        x = torch.randn(2, 3, 64, 128, generator=torch.Generator().manual_seed(0)).to(dtype).requires_grad_()
        twin = x.detach().clone().requires_grad_()
        swapped = torch.cat((-twin[..., 64:], twin[..., :64]), dim=-1)  # the rotate-half of Hugging Face's models
        got, want = apply_rotary(x, cos, sin), twin * cos + swapped * sin
        assert torch.equal(got, want), dtype
        probe = torch.randn(got.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        (got * probe).sum().backward()
        (want * probe).sum().backward()
        assert torch.equal(x.grad, twin.grad), dtype


def test_under_bf16_autocast_a_float32_inputs_swapped_half_is_rounded_to_bf16_and_no_further():
    """A float32 input under autocast (the queries of a model kept in float32 without autocast's projections):
    the swap's product is a bf16 matmul there, so the swapped half carries bf16's rounding of the input, the rest
    stays float32."""
    inv = inverse_frequencies(128, 1_000_000.0)
    cos, sin = rotary_cos_sin(torch.arange(64), inv, torch.float32)
    x = torch.randn(2, 3, 64, 128, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = apply_rotary(x, cos, sin)
    rounded = x.to(torch.bfloat16).float()
    want = x * cos + torch.cat((-rounded[..., 64:], rounded[..., :64]), dim=-1) * sin
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    exact = x * cos + torch.cat((-x[..., 64:], x[..., :64]), dim=-1) * sin
    assert (got - exact).abs().max() <= 2**-8 * x.abs().max()  # bf16's rounding of the largest input, at most


def test_a_16_bit_input_is_rotated_in_its_own_dtype_with_the_angles_rounded_to_it():
    """float32 angles do not widen bf16 queries to float32 (twice the bytes through every op after them)."""
    inv = inverse_frequencies(128, 1_000_000.0)
    cos, sin = rotary_cos_sin(torch.arange(64), inv, torch.float32)
    x = torch.randn(2, 3, 64, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    got = apply_rotary(x, cos, sin)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, apply_rotary(x, cos.to(torch.bfloat16), sin.to(torch.bfloat16)))
    exact = apply_rotary(x.float(), cos, sin)
    assert (got.float() - exact).abs().max() <= 2**-6 * exact.abs().max()  # bf16 angles and products
