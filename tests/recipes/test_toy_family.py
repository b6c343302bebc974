"""A model family added as docs/adding-a-model.md says: one ``ModelSpec``, here defined in the test and passed to
the lookups in a mapping of its own (``SPECS``), so nothing global learns of it. It builds, trains a few steps on
the cpu lane, and exports both ways (titanpod's model.safetensors, Hugging Face's folder), reloading equal."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from titanpod.checkpoint import load_hf_checkpoint, load_model, save_hf_checkpoint, save_model
from titanpod.device import get_backend
from titanpod.graph import train
from titanpod.models import DecoderArgs, Transformer
from titanpod.models.adapters import DecoderAdapter, DecoderHFForm
from titanpod.parallel import DECODER_PLAN
from titanpod.recipes import RECIPES, Recipe
from titanpod.recipes.families import (
    MODEL_SPECS,
    ModelSpec,
    build_model,
    decoder_adapters,
    hf_adapter,
    model_spec,
    named_recipes,
    sharding_plan,
)
from titanpod.recipes.recipe_templates import debug_recipe

TOY_FLAVORS = {
    "debug": DecoderArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=2048, ffn_dim=48, max_seq_len=256),
}


def toy_debug() -> Recipe:
    """The toy's debug flavor for three steps."""
    return debug_recipe("toy_debug", "toy", steps=3)


TOY = ModelSpec(
    name="toy",
    flavors=TOY_FLAVORS,
    build=Transformer,
    plan=DECODER_PLAN,
    hf_adapter=DecoderAdapter("toy", DecoderHFForm("ToyForCausalLM", "toy")),
    recipes={"toy_debug": toy_debug},
)
SPECS = {**MODEL_SPECS, TOY.name: TOY}


def batches(vocab: int, batch: int, seq: int):
    """Random next-token batches, seeded."""
    generator = torch.Generator().manual_seed(0)
    while True:
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
        yield tokens[:, :-1], tokens[:, 1:]


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    ours, theirs = a.state_dict(), b.state_dict()
    return ours.keys() == theirs.keys() and all(torch.equal(ours[name], theirs[name]) for name in ours)


def test_the_toy_family_is_known_only_where_its_spec_is_passed():
    assert model_spec("toy", SPECS) is TOY
    assert "toy_debug" in named_recipes(specs=SPECS) and "toy_debug" not in RECIPES
    with pytest.raises(KeyError, match="Unknown model family 'toy'"):
        model_spec("toy")


def test_a_toy_family_trains_on_the_cpu_lane_exports_and_reloads(tmp_path):
    recipe = named_recipes(specs=SPECS)["toy_debug"]()
    model = build_model(recipe.model.family, recipe.model.flavor, device="cpu", specs=SPECS)
    model.init_weights(recipe.train.seed)
    for name, _ in model.named_parameters():
        sharding_plan("toy", SPECS).rule_for(name)  # the plan places every parameter
    initial = {name: param.detach().clone() for name, param in model.named_parameters()}

    config = dataclasses.replace(recipe.train, warmup_steps=1, log_every=1)
    args = model_spec("toy", SPECS).flavor(recipe.model.flavor)
    summary = train(model, batches(args.vocab_size, 2, 16), config, get_backend("cpu"), flops_per_token=1.0)
    assert len(summary.losses) == 3 and all(torch.isfinite(torch.tensor(summary.losses)))
    assert any(not torch.equal(param, initial[name]) for name, param in model.named_parameters())

    save_model(model, "toy", tmp_path / "model")
    family, reloaded = load_model(tmp_path / "model")
    assert family == "toy" and same_weights(reloaded, model)

    folder = save_hf_checkpoint(model, hf_adapter("toy", SPECS), tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["ToyForCausalLM"]
    loaded = load_hf_checkpoint(folder, adapters=decoder_adapters(SPECS))
    assert loaded.family == "toy" and loaded.model.args == args and same_weights(loaded.model, model)
