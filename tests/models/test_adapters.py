"""The Hugging Face state-dict adapters: titanpod's tensors -> Hugging Face names and back, exactly,
against the state dicts transformers and diffusers build themselves."""

from __future__ import annotations

import pytest
import torch

from titanpod.models.adapters import (
    FLUX_AUTOENCODER_ADAPTER,
    FLUX_TRANSFORMER_ADAPTER,
    HFSlot,
    UnsupportedConfigError,
    adapter_of_hf_config,
)
from titanpod.models.flux import FLUX_FLAVORS, build_flux_transformer
from titanpod.models.flux.autoencoder import build_flux_autoencoder
from titanpod.recipes.families import build_model, decoder_adapters, hf_adapter


def _initialised(model: torch.nn.Module) -> torch.nn.Module:
    model.to_empty(device="cpu")
    model.init_weights(0)
    return model


BUILDERS = {
    "llama3": lambda: (hf_adapter("llama3"), build_model("llama3", "debug")),
    "qwen3_moe": lambda: (hf_adapter("qwen3_moe"), build_model("qwen3_moe", "debug")),
    "flux": lambda: (FLUX_TRANSFORMER_ADAPTER, build_flux_transformer(FLUX_FLAVORS["debug"], device="meta")),
    "autoencoder": lambda: (FLUX_AUTOENCODER_ADAPTER, build_flux_autoencoder("debug")),
}


def _model(kind: str):
    """An adapter and its family's debug model with initialised weights."""
    adapter, model = BUILDERS[kind]()
    return adapter, _initialised(model)


@pytest.mark.parametrize("kind", BUILDERS)
def test_to_hf_then_from_hf_gives_back_every_parameter_exactly(kind: str) -> None:
    adapter, model = _model(kind)
    state = dict(model.named_parameters())
    hf_state = dict(adapter.to_hf(state, model.args))
    assert hf_state.keys() == adapter.hf_layout(model.args).keys()
    assert adapter.hf_shapes(state, model.args) == {name: tuple(t.shape) for name, t in hf_state.items()}
    back = adapter.from_hf(hf_state, model.args)
    assert back.keys() == state.keys()
    for name, param in state.items():
        assert torch.equal(back[name], param), name


def test_to_hf_gives_views_that_write_through() -> None:
    adapter, model = _model("qwen3_moe")  # experts are slices of one parameter
    state = dict(model.named_parameters())
    hf_state = dict(adapter.to_hf(state, model.args))
    with torch.no_grad():
        hf_state["model.layers.1.mlp.experts.3.up_proj.weight"].fill_(7.0)
    assert torch.all(state["layers.1.feed_forward.experts.w3"][3] == 7.0)
    assert not torch.any(state["layers.1.feed_forward.experts.w3"][2] == 7.0)


def test_from_hf_names_missing_and_unexpected_tensors() -> None:
    adapter, model = _model("flux")
    hf_state = dict(adapter.to_hf(dict(model.named_parameters()), model.args))
    hf_state.pop("single_transformer_blocks.0.attn.to_k.weight")
    hf_state["extra.weight"] = torch.zeros(1)
    with pytest.raises(KeyError, match=r"single_transformer_blocks\.0\.attn\.to_k\.weight \(titanpod single_blocks"):
        adapter.from_hf(hf_state, model.args)
    with pytest.raises(KeyError, match=r"unexpected \['extra\.weight'\]"):
        adapter.from_hf({**hf_state, "single_transformer_blocks.0.attn.to_k.weight": torch.zeros(1)}, model.args)


def test_slot_describes_and_views_its_part() -> None:
    param = torch.arange(12.0).view(4, 3)
    assert torch.equal(HFSlot("w", expert=2).view(param), param[2])
    assert torch.equal(HFSlot("w", rows=(1, 3)).view(param), param[1:3])
    assert HFSlot("w").view(param) is param
    assert HFSlot("w", expert=2).describe() == "w expert 2"
    assert HFSlot("w", rows=(1, 3)).describe() == "w rows 1:3"


def test_decoder_adapter_refuses_another_family() -> None:
    with pytest.raises(UnsupportedConfigError, match="supported: LlamaForCausalLM"):
        adapter_of_hf_config({"architectures": ["MistralForCausalLM"]}, decoder_adapters())
    config = hf_adapter("qwen3").hf_config_from_args(build_model("qwen3", "debug").args, torch.bfloat16)
    assert config["dtype"] == "bfloat16"
    assert adapter_of_hf_config(config, decoder_adapters()) is hf_adapter("qwen3")
    with pytest.raises(UnsupportedConfigError, match=r"Qwen3ForCausalLM.*not LlamaForCausalLM \(llama3\)"):
        hf_adapter("llama3").args_from_hf_config(config)


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_decoder_from_hf_loads_transformers_own_state_dict(family: str) -> None:
    pytest.importorskip("transformers")
    from tests.hf_models import hf_model

    reference = hf_model(family)
    adapter = hf_adapter(family)
    args = adapter.args_from_hf_config(reference.config.to_dict())
    theirs = reference.state_dict()
    if args.tie_embeddings:  # transformers keeps the tied head under its own name; its files do not
        theirs.pop("lm_head.weight")
    model = build_model(family, args, device="cpu")
    model.load_state_dict(adapter.from_hf(theirs, args), strict=True)
    for name, tensor in adapter.to_hf(dict(model.named_parameters()), args):
        assert torch.equal(tensor, theirs[name]), name


def test_flux_adapters_load_diffusers_own_state_dicts() -> None:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    references = [
        (
            FLUX_TRANSFORMER_ADAPTER,
            diffusers.FluxTransformer2DModel(
                in_channels=16,
                num_layers=1,
                num_single_layers=2,
                attention_head_dim=16,
                num_attention_heads=2,
                joint_attention_dim=24,
                pooled_projection_dim=12,
                axes_dims_rope=(4, 6, 6),
                guidance_embeds=True,
            ),
            lambda args: build_flux_transformer(args, device="cpu"),
        ),
        (
            FLUX_AUTOENCODER_ADAPTER,
            diffusers.AutoencoderKL(
                block_out_channels=[32, 64],
                down_block_types=["DownEncoderBlock2D"] * 2,
                up_block_types=["UpDecoderBlock2D"] * 2,
                norm_num_groups=8,
                latent_channels=16,
                use_quant_conv=False,
                use_post_quant_conv=False,
            ),
            lambda args: build_flux_autoencoder(args, device="cpu"),
        ),
    ]
    for adapter, reference, build in references:
        args = adapter.args_from_hf_config(dict(reference.config))
        theirs = reference.state_dict()
        model = build(args)
        model.load_state_dict(adapter.from_hf(theirs, args), strict=True)
        ours = dict(adapter.to_hf(dict(model.named_parameters()), args))
        assert ours.keys() == theirs.keys()
        for name, tensor in ours.items():
            assert torch.equal(tensor, theirs[name]), name
