"""Recipes: lookup, JSON round trip, and errors that name the field."""

import dataclasses

import pytest

from titanpod.recipes import RECIPES, Recipe, get_recipe
from titanpod.runs import run_pretraining
from titanpod.runs.pretrain import build_run_data


def test_every_named_recipe_builds_and_round_trips_through_json(tmp_path):
    for name in RECIPES:
        recipe = get_recipe(name)
        assert recipe.name == name
        path = tmp_path / f"{name}.json"
        path.write_text(recipe.to_json())
        assert Recipe.load(path) == recipe


def test_unknown_recipe_suggests_the_closest():
    with pytest.raises(KeyError, match="Did you mean 'llama3_debug'"):
        get_recipe("llama3_debgu")


def test_unknown_fields_are_named():
    data = get_recipe("llama3_debug").to_dict()
    data["train"]["stepz"] = 3
    with pytest.raises(ValueError, match=r"Unknown fields in recipe\.train: stepz"):
        Recipe.from_dict(data)
    with pytest.raises(ValueError, match="Unknown fields in recipe: optimiser"):
        Recipe.from_dict({"optimiser": {}})


def test_tokenizer_larger_than_the_model_vocabulary_is_rejected_before_training():
    recipe = get_recipe("llama3_debug")
    with pytest.raises(ValueError, match=r"tokenizer .* has 1,\d+ tokens but the model's vocabulary has 512 rows"):
        build_run_data(recipe, vocab_size=512, rank=0, world_size=1)


def test_unwritable_run_directory_fails_before_any_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    recipe = get_recipe("llama3_debug")
    recipe = dataclasses.replace(recipe, output=dataclasses.replace(recipe.output, runs_dir=str(blocker)))
    with pytest.raises(OSError, match="Cannot write the run directory"):
        run_pretraining(recipe)


def test_capacity_factor_reaches_the_model_and_is_refused_for_a_dense_one():
    recipe = get_recipe("qwen3_moe_debug")
    assert recipe.model.args().moe.capacity_factor is None  # the shipped flavors drop nothing
    tight = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, capacity_factor=1.25))
    assert Recipe.from_dict(tight.to_dict()) == tight
    assert tight.model.args().moe.capacity_factor == 1.25
    dense = get_recipe("llama3_debug")
    with pytest.raises(ValueError, match="capacity_factor applies to mixture-of-experts models only"):
        dataclasses.replace(dense.model, capacity_factor=1.25).args()
