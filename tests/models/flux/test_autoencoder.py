"""The FLUX autoencoder against diffusers' AutoencoderKL: shapes, names, numerics, config strictness."""

from __future__ import annotations

import pytest
import torch

from titanpod.models.adapters.flux_autoencoder import (
    UnsupportedAutoencoderConfigError,
    autoencoder_args_from_diffusers_config,
    diffusers_config_from_autoencoder_args,
    diffusers_name,
    diffusers_names,
)
from titanpod.models.flux.autoencoder import FLUX_AUTOENCODER_FLAVORS, FluxAutoencoderArgs, build_flux_autoencoder

diffusers = pytest.importorskip("diffusers")

TINY = {
    "block_out_channels": [32, 64, 64],
    "down_block_types": ["DownEncoderBlock2D"] * 3,
    "up_block_types": ["UpDecoderBlock2D"] * 3,
    "layers_per_block": 2,
    "norm_num_groups": 8,
    "latent_channels": 16,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
}


def _diffusers_tiny(seed: int = 0):
    torch.manual_seed(seed)
    return diffusers.AutoencoderKL(**TINY).eval()


def _titanpod_from(reference) -> torch.nn.Module:
    """A titanpod autoencoder holding the diffusers model's weights, moved through the name map."""
    model = build_flux_autoencoder(autoencoder_args_from_diffusers_config(dict(reference.config)), device="cpu")
    state = reference.state_dict()
    model.load_state_dict({ours: state[theirs] for theirs, ours in diffusers_names(model).items()}, strict=True)
    return model.eval()


def test_flux_flavor_has_diffusers_names_shapes_and_parameter_count() -> None:
    """The public FLUX.1 shape: 83,819,683 parameters, every one named and shaped as diffusers' AutoencoderKL."""
    ours = build_flux_autoencoder("flux")
    config = diffusers_config_from_autoencoder_args(FLUX_AUTOENCODER_FLAVORS["flux"])
    with torch.device("meta"):
        theirs = diffusers.AutoencoderKL(**{k: v for k, v in config.items() if not k.startswith("_")})
    shapes = {name: tuple(p.shape) for name, p in ours.named_parameters()}
    their_shapes = {name: tuple(t.shape) for name, t in theirs.state_dict().items()}
    mapped = {theirs_name: shapes[ours_name] for theirs_name, ours_name in diffusers_names(ours).items()}
    assert mapped == their_shapes
    assert sum(shapes_numel(s) for s in shapes.values()) == 83_819_683
    assert ours.args.downsample_factor == 8
    assert next(ours.parameters()).is_meta


def shapes_numel(shape: tuple[int, ...]) -> int:
    return int(torch.Size(shape).numel())


def test_encode_and_decode_match_diffusers() -> None:
    """fp32 on the CPU, measured max abs: mean 1.2e-6, logvar 1.4e-6, decode 3.8e-6; bound 1e-4."""
    reference = _diffusers_tiny()
    model = _titanpod_from(reference)
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    latents = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, theirs = model.encode(images), reference.encode(images).latent_dist
        assert ours.mean.shape == (2, 16, 8, 8)
        torch.testing.assert_close(ours.mean, theirs.mean, atol=1e-4, rtol=0)
        torch.testing.assert_close(ours.logvar, theirs.logvar, atol=1e-4, rtol=0)
        torch.testing.assert_close(ours.std, theirs.std, atol=1e-4, rtol=0)
        torch.testing.assert_close(
            ours.sample(torch.Generator().manual_seed(3)),
            theirs.sample(torch.Generator().manual_seed(3)),
            atol=1e-4,
            rtol=0,
        )
        torch.testing.assert_close(ours.kl(), theirs.kl(), atol=1e-3, rtol=1e-5)
        decoded = model.decode(latents)
        assert decoded.shape == (2, 3, 32, 32)
        torch.testing.assert_close(decoded, reference.decode(latents).sample, atol=1e-4, rtol=0)
        torch.testing.assert_close(model(images), reference(images).sample, atol=1e-4, rtol=0)


def test_model_space_is_the_flux_pipeline_arithmetic() -> None:
    """(latents - shift) x scale into the transformer; latents / scale + shift back, as FluxPipeline does."""
    model = build_flux_autoencoder("debug", device="cpu")
    latents = torch.randn(1, 16, 4, 4)
    expected = (latents - 0.1159) * 0.3611
    torch.testing.assert_close(model.to_model_space(latents), expected)
    torch.testing.assert_close(model.from_model_space(expected), latents)


def test_debug_flavor_builds_on_meta_initialises_deterministically_and_trains() -> None:
    """Same seed, same weights; 32x32 images give 16 x 4 x 4 latents; every parameter gets a gradient."""
    args = FLUX_AUTOENCODER_FLAVORS["debug"]
    assert (args.latent_channels, args.downsample_factor) == (16, 8)
    models = []
    for seed in (0, 0, 1):
        model = build_flux_autoencoder("debug")
        model.to_empty(device="cpu")
        model.init_weights(seed)
        models.append(model)
    same = [torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True)]
    different = [torch.equal(a, b) for a, b in zip(models[0].parameters(), models[2].parameters(), strict=True)]
    assert all(same)
    assert not all(different)
    model = models[0]
    images = torch.rand(1, 3, 32, 32) * 2 - 1
    posterior = model.encode(images)
    assert posterior.mean.shape == (1, 16, 4, 4)
    reconstruction = model.decode(posterior.sample(torch.Generator().manual_seed(0)))
    assert reconstruction.shape == images.shape
    loss = (reconstruction - images).pow(2).mean() + 1e-6 * posterior.kl().mean()
    loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing


def test_encode_and_decode_name_bad_shapes() -> None:
    model = build_flux_autoencoder("debug", device="cpu")
    with pytest.raises(ValueError, match="multiples of 8"):
        model.encode(torch.zeros(1, 3, 36, 32))
    with pytest.raises(ValueError, match=r"images \[B, 3, H, W\]"):
        model.encode(torch.zeros(1, 4, 32, 32))
    with pytest.raises(ValueError, match=r"latents \[B, 16, H, W\]"):
        model.decode(torch.zeros(1, 4, 4, 4))


def test_config_round_trips_through_diffusers() -> None:
    """Our config.json builds the same AutoencoderKL config; reading diffusers' back gives the same args."""
    for args in FLUX_AUTOENCODER_FLAVORS.values():
        config = diffusers_config_from_autoencoder_args(args)
        assert autoencoder_args_from_diffusers_config(config) == args
        with torch.device("meta"):
            theirs = diffusers.AutoencoderKL(**{k: v for k, v in config.items() if not k.startswith("_")})
        assert autoencoder_args_from_diffusers_config(dict(theirs.config)) == args


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"use_quant_conv": True}, "use_quant_conv"),
        ({"use_post_quant_conv": None}, "use_post_quant_conv"),  # absent means diffusers' default: true
        ({"act_fn": "gelu"}, "act_fn"),
        ({"mid_block_add_attention": False}, "mid_block_add_attention"),
        ({"latents_mean": [0.0] * 16}, "latents_mean"),
        (
            {"down_block_types": ["DownEncoderBlock2D", "AttnDownEncoderBlock2D", "DownEncoderBlock2D"]},
            "down_block_types",
        ),
        ({"up_block_types": ["UpDecoderBlock2D"] * 2}, "up_block_types"),
        ({"_class_name": "AutoencoderTiny"}, "_class_name"),
        ({"layers_per_block": 1.5}, "layers_per_block"),
        ({"sample_size": [64, 64]}, "sample_size"),
        ({"norm_num_groups": 7}, "norm_num_groups"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_unsupported_config_values_name_the_key(change: dict, key: str) -> None:
    config = {**TINY, "_class_name": "AutoencoderKL", "act_fn": "silu"}
    for name, value in change.items():
        if value is None:
            config.pop(name)
        else:
            config[name] = value
    with pytest.raises(UnsupportedAutoencoderConfigError, match=key):
        autoencoder_args_from_diffusers_config(config)


def test_missing_shift_factor_means_no_shift() -> None:
    config = {**TINY, "shift_factor": None}
    assert autoencoder_args_from_diffusers_config(config).shift_factor == 0.0


def test_export_refuses_what_diffusers_cannot_express() -> None:
    with pytest.raises(UnsupportedAutoencoderConfigError, match="norm_eps"):
        diffusers_config_from_autoencoder_args(FluxAutoencoderArgs(norm_eps=1e-5))


def test_args_validate_group_count() -> None:
    with pytest.raises(ValueError, match="norm_num_groups"):
        FluxAutoencoderArgs(block_out_channels=(32, 48), norm_num_groups=32)


def test_names_map_each_kind_of_tensor() -> None:
    assert diffusers_name("encoder.down.1.resample.conv.weight") == "encoder.down_blocks.1.downsamplers.0.conv.weight"
    assert diffusers_name("decoder.up.0.resample.conv.bias") == "decoder.up_blocks.0.upsamplers.0.conv.bias"
    assert diffusers_name("encoder.down.1.resnets.0.shortcut.weight") == (
        "encoder.down_blocks.1.resnets.0.conv_shortcut.weight"
    )
    assert diffusers_name("decoder.mid.attention.proj.weight") == "decoder.mid_block.attentions.0.to_out.0.weight"
    assert diffusers_name("encoder.mid.attention.k.bias") == "encoder.mid_block.attentions.0.to_k.bias"
    assert diffusers_name("encoder.mid.resnet2.norm1.weight") == "encoder.mid_block.resnets.1.norm1.weight"
    assert diffusers_name("decoder.norm_out.weight") == "decoder.conv_norm_out.weight"
