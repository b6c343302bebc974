"""The registries of families are read from the specs, and each spec's parts agree with its name."""

from __future__ import annotations

from titanpod.models.adapters import DecoderAdapter
from titanpod.recipes import RECIPES
from titanpod.recipes.diffusion.registry import DIFFUSION_RECIPES
from titanpod.recipes.families import MODEL_SPECS, decoder_adapters, named_recipes


def test_every_named_recipe_is_a_specs_and_trains_that_family():
    assert dict(RECIPES) == named_recipes() and "llama3_debug" in RECIPES
    assert dict(DIFFUSION_RECIPES) == named_recipes("diffusion") == dict(MODEL_SPECS["flux"].recipes)
    for name, spec in MODEL_SPECS.items():
        for recipe_name, recipe in spec.recipes.items():
            made = recipe()
            assert made.name == recipe_name and made.model.flavor in spec.flavors
            assert getattr(made.model, "family", "flux") == name  # a diffusion recipe's model is FLUX.1


def test_each_decoder_family_is_read_from_hugging_face_as_itself():
    adapters = decoder_adapters()
    assert set(adapters) == {"llama3", "qwen3", "qwen3_moe"}
    assert all(isinstance(adapter, DecoderAdapter) and adapter.family == name for name, adapter in adapters.items())
    assert len({adapter.form.architecture for adapter in adapters.values()}) == len(adapters)
