"""The FLUX.1 transformer: flavors and their sizes, meta builds, initialisation, the attention slot,
counting and input checks.

Parity with diffusers comes with the Hugging Face adapter (tests/checkpoint/test_flux_parity.py);
these tests check the properties the model must have whatever its weights.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from titanpod.models import FLUX_FLAVORS, FluxArgs, FluxOps, FluxTransformer, parameter_count
from titanpod.models.adapters.flux_transformer import flux_hf_layout, flux_hf_tensors
from titanpod.models.flux import (
    build_flux_transformer,
    flux_args_from_dict,
    flux_args_to_dict,
    flux_flops_per_sample,
    flux_matmul_params,
    full_sdpa_attention,
)
from titanpod.models.flux.layers import apply_pair_rotary, axes_rotary_cos_sin

DEBUG = FLUX_FLAVORS["debug"]
B, L, T = 2, 12, 5


def random_model(args: FluxArgs = DEBUG, ops: FluxOps | None = None, seed: int = 0) -> FluxTransformer:
    """A model whose every parameter is random (init_weights zeroes the modulation, which hides bugs)."""
    model = build_flux_transformer(args, ops, device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return model


def inputs(args: FluxArgs = DEBUG, seed: int = 1, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor | None]:
    """Random inputs for a 3 x 4 grid of image tokens and ``T`` text tokens."""
    generator = torch.Generator().manual_seed(seed)
    rows, cols = torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij")
    img_ids = torch.stack((torch.zeros_like(rows), rows, cols), dim=-1).reshape(-1, 3)
    return {
        "img_BLC": torch.randn(B, L, args.in_channels, generator=generator, dtype=dtype),
        "img_ids_L3": img_ids,
        "txt_BTD": torch.randn(B, T, args.context_dim, generator=generator, dtype=dtype),
        "txt_ids_T3": torch.zeros(T, 3, dtype=torch.long),
        "timesteps_B": torch.rand(B, generator=generator),
        "pooled_BP": torch.randn(B, args.pooled_dim, generator=generator, dtype=dtype),
        "guidance_B": torch.full((B,), 3.5) if args.guidance_embed else None,
    }


def test_flavors_have_the_published_shapes():
    dev, schnell = FLUX_FLAVORS["dev"], FLUX_FLAVORS["schnell"]
    for args in (dev, schnell):
        assert (args.in_channels, args.dim, args.n_heads, args.head_dim) == (64, 3072, 24, 128)
        assert (args.depth, args.depth_single, args.mlp_ratio) == (19, 38, 4.0)
        assert (args.context_dim, args.pooled_dim, args.axes_dims, args.rope_theta) == (4096, 768, (16, 56, 56), 1e4)
        assert args.qkv_bias
    assert dev.guidance_embed and not schnell.guidance_embed
    assert DEBUG.dim == DEBUG.n_heads * DEBUG.head_dim == sum(DEBUG.axes_dims) * DEBUG.n_heads


def test_parameter_totals_of_every_flavor_on_meta():
    """dev 11,901,408,320 (11.90B, as published); schnell 11,891,178,560 (11.89B: no guidance MLP)."""
    totals = {}
    for name in FLUX_FLAVORS:
        model = build_flux_transformer(name)
        assert all(p.device.type == "meta" for p in model.parameters())
        totals[name] = parameter_count(model)
    assert round(totals["dev"] / 1e9, 2) == 11.90
    assert round(totals["schnell"] / 1e9, 2) == 11.89
    assert totals["dev"] == 11_901_408_320
    assert totals["schnell"] == 11_891_178_560
    assert totals["debug"] < 300_000


def test_build_under_the_meta_device_context():
    with torch.device("meta"):
        model = FluxTransformer(FLUX_FLAVORS["dev"])
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.guidance_in is not None
    assert build_flux_transformer("schnell").guidance_in is None


def test_matmul_parameters_are_the_linear_weights():
    for name in FLUX_FLAVORS:
        model = build_flux_transformer(name)
        linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
        assert flux_matmul_params(model.args).total == linear


def test_flops_per_sample_follows_the_stated_convention():
    args = DEBUG
    dim, mlp = args.dim, args.mlp_dim
    per_sample = (
        2 * (256 * dim + dim * dim) + (32 * dim + dim * dim) + 2 * dim * 6 * dim + dim * 3 * dim + dim * 2 * dim
    )
    stream = 4 * dim * dim + 2 * dim * mlp
    image = 64 * dim + stream + dim * 64
    text = 64 * dim + stream
    joint = dim * (3 * dim + mlp) + (dim + mlp) * dim
    image_tokens, text_tokens = 256, 32
    seq = image_tokens + text_tokens
    expected = 6 * (per_sample + image * image_tokens + text * text_tokens + joint * seq) + 12 * 2 * 2 * 32 * seq * seq
    model = build_flux_transformer("debug")
    assert model.flops_per_sample(image_tokens, text_tokens) == expected
    assert flux_flops_per_sample(args, image_tokens, text_tokens) == expected


def test_init_is_deterministic_and_adaln_zero():
    first, second, other = (build_flux_transformer("debug", device="cpu") for _ in range(3))
    first.init_weights(seed=3)
    second.init_weights(seed=3)
    other.init_weights(seed=4)
    a, b, c = first.state_dict(), second.state_dict(), other.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert torch.all(a["double_blocks.0.img_mod.weight"] == 0) and torch.all(a["final_layer.linear.weight"] == 0)
    assert torch.all(a["single_blocks.0.q_norm.weight"] == 1) and torch.all(a["img_in.bias"] == 0)
    assert a["double_blocks.0.img_attn.wq.weight"].std() == pytest.approx(0.02, rel=0.1)
    # adaLN-Zero: every block starts as the identity and the prediction as zero.
    assert torch.all(first(**inputs()) == 0)


def test_meta_build_then_init_on_the_cpu():
    model = build_flux_transformer("debug")
    model.to_empty(device="cpu")
    model.init_weights(0)
    reference = build_flux_transformer("debug", device="cpu")
    reference.init_weights(0)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True))


def test_attention_slot_is_called_and_its_result_used():
    calls = []

    def spy(q, k, v):
        calls.append(tuple(q.shape))
        return full_sdpa_attention(q, k, v)

    expected = random_model()(**inputs())
    spied = random_model(ops=FluxOps(attention=spy))(**inputs())
    assert torch.equal(spied, expected)
    assert calls == [(B, DEBUG.n_heads, T + L, DEBUG.head_dim)] * (DEBUG.depth + DEBUG.depth_single)

    def values_only(q, k, v):
        return v

    swapped = random_model(ops=FluxOps(attention=values_only))(**inputs())
    assert not torch.allclose(swapped, expected)


def test_output_shape_dtype_and_gradients():
    model = random_model()
    batch = inputs()
    out = model(**batch)
    assert out.shape == (B, L, DEBUG.in_channels)
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    bf16 = random_model().to(torch.bfloat16)
    assert bf16(**inputs(dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_rope_is_relative_shifting_every_position_changes_nothing():
    model = random_model()
    batch = inputs()
    shifted = dict(batch, img_ids_L3=batch["img_ids_L3"] + torch.tensor([2, 5, 7]))
    shifted["txt_ids_T3"] = batch["txt_ids_T3"] + torch.tensor([2, 5, 7])
    torch.testing.assert_close(model(**shifted), model(**batch), atol=1e-4, rtol=1e-4)


def test_rope_rotates_adjacent_pairs_axis_by_axis():
    ids = torch.tensor([[0, 0, 0], [1, 2, 3]])
    cos, sin = axes_rotary_cos_sin(ids, (4, 6, 6), theta=10000.0)
    assert cos.shape == sin.shape == (2, 8)
    assert torch.equal(cos[0], torch.ones(8)) and torch.equal(sin[0], torch.zeros(8))
    # pair 0 belongs to axis 0 (frequency 1, position 1); pair 2 to axis 1 (frequency 1, position 2).
    assert sin[1, 0].item() == pytest.approx(torch.tensor(1.0).sin().item())
    assert sin[1, 2].item() == pytest.approx(torch.tensor(2.0).sin().item())
    x = torch.tensor([1.0, 0.0] * 8).view(1, 1, 1, 16).expand(1, 1, 2, 16)
    rotated = apply_pair_rotary(x, cos, sin)
    assert rotated[0, 0, 1, 1].item() == pytest.approx(torch.tensor(1.0).sin().item())


def test_inputs_are_checked_with_errors_that_say_what_to_pass():
    model = random_model()
    batch = inputs()
    with pytest.raises(ValueError, match="pass guidance_B"):
        model(**dict(batch, guidance_B=None))
    with pytest.raises(ValueError, match="no batch dimension"):
        model(**dict(batch, img_ids_L3=batch["img_ids_L3"][None].expand(B, L, 3)))
    schnell_like = random_model(dataclasses.replace(DEBUG, guidance_embed=False))
    with pytest.raises(ValueError, match="drop guidance_B"):
        schnell_like(**batch)


def test_args_are_validated_and_round_trip_through_plain_data():
    with pytest.raises(ValueError, match="n_heads x head_dim"):
        FluxArgs(dim=100)
    with pytest.raises(ValueError, match="sum to head_dim"):
        FluxArgs(axes_dims=(16, 56, 58))
    for args in FLUX_FLAVORS.values():
        assert flux_args_from_dict(flux_args_to_dict(args)) == args
    with pytest.raises(ValueError, match="depht"):
        flux_args_from_dict({"depht": 3})
    with pytest.raises(KeyError, match="choose one of debug, schnell, dev"):
        build_flux_transformer("pro")


def test_diffusers_layout_covers_every_row_of_every_parameter_once():
    for name in ("debug", "dev"):
        model = build_flux_transformer(name)
        params = dict(model.named_parameters())
        covered = {param_name: 0 for param_name in params}
        for slot in flux_hf_layout(model.args).values():
            rows = params[slot.name].shape[0] if slot.rows is None else slot.rows[1] - slot.rows[0]
            covered[slot.name] += rows
        assert covered == {param_name: param.shape[0] for param_name, param in params.items()}
        tensors = dict(flux_hf_tensors(model))
        assert sum(t.numel() for t in tensors.values()) == parameter_count(model)
