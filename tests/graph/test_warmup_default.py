"""The default warmup scales with the run, so a short run needs no warmup flag; an explicit one still must fit."""

from __future__ import annotations

import pytest

from titanpod.graph import TrainConfig
from titanpod.graph.schedule import lr_multiplier
from titanpod.pretrain.command import parse_command
from titanpod.recipes import Recipe, get_recipe


@pytest.mark.parametrize(("steps", "warmup"), [(1, 0), (5, 0), (50, 5), (100, 10), (10_000, 10)])
def test_unset_warmup_is_a_tenth_of_the_run_at_most_ten(steps, warmup):
    config = TrainConfig(steps=steps)
    assert config.warmup_steps is None and config.resolved_warmup_steps == warmup
    if warmup:
        assert lr_multiplier(warmup, config) == 1.0 and lr_multiplier(1, config) == pytest.approx(1 / warmup)


def test_an_explicit_warmup_that_does_not_end_before_the_last_step_is_refused():
    with pytest.raises(ValueError) as error:
        TrainConfig(steps=5, warmup_steps=10)
    message = str(error.value)
    assert "train.warmup_steps=10" in message and "train.steps=5" in message and "--train.warmup-steps" in message
    assert TrainConfig(steps=5, warmup_steps=4).resolved_warmup_steps == 4


def test_a_short_run_of_the_default_recipe_needs_no_warmup_flag(tmp_path):
    recipe = parse_command(["--train.steps", "5"]).recipe
    assert recipe.train.steps == 5 and recipe.train.resolved_warmup_steps == 0
    assert get_recipe("llama3_debug").train.resolved_warmup_steps == 10  # as before at its 100 steps
    assert get_recipe("llama3_8b").train.warmup_steps == 500  # recipes that set it keep it
    path = tmp_path / "recipe.json"
    path.write_text(recipe.to_json(), encoding="utf-8")
    loaded = Recipe.load(path)  # unset stays unset in recipe.json, so a resumed or rescaled run re-derives it
    assert loaded.train.warmup_steps is None and loaded.train == recipe.train
