"""Every shipped recipe takes ``--train.steps 5`` alone: a recipe that sets its warmup (SFT's 30 of 300 steps,
FLUX's 50 of 10,000) warms up for the same share of a shorter run, unless the warmup is given too."""

from __future__ import annotations

import pytest

from titanpod.diffusion.command import parse_train
from titanpod.posttrain.command import parse_command as parse_posttrain
from titanpod.pretrain.command import parse_command as parse_pretrain
from titanpod.recipes import RECIPES
from titanpod.recipes.command_line import flag_value, with_steps_scaled
from titanpod.recipes.diffusion.registry import DIFFUSION_RECIPES
from titanpod.recipes.posttrain.registry import POSTTRAIN_RECIPES, get_posttrain_recipe
from titanpod.recipes.warmup import scaled_warmup

SHIPPED = (
    [(parse_pretrain, name) for name in RECIPES]
    + [(parse_posttrain, name) for name in POSTTRAIN_RECIPES]
    + [(parse_train, name) for name in DIFFUSION_RECIPES]
)


@pytest.mark.parametrize(("parse", "name"), SHIPPED, ids=[name for _, name in SHIPPED])
def test_every_shipped_recipe_takes_five_steps_alone(parse, name):
    recipe = parse(["--recipe", name, "--train.steps", "5"]).recipe
    assert recipe.train.steps == 5
    assert 0 <= recipe.train.resolved_warmup_steps < 5


def test_a_set_warmup_keeps_its_share_of_a_shorter_run_and_the_users_own_wins():
    sft = get_posttrain_recipe("sft_debug").build()
    assert (sft.train.steps, sft.train.warmup_steps) == (300, 30)
    assert parse_posttrain(["--train.steps", "100"]).recipe.train.warmup_steps == 10
    assert parse_posttrain(["--train.steps=50"]).recipe.train.warmup_steps == 5
    assert parse_posttrain(["--train.steps", "600"]).recipe.train.warmup_steps == 30  # a longer run: as set
    given = parse_posttrain(["--train.steps", "100", "--train.warmup-steps", "40"]).recipe.train
    assert (given.steps, given.warmup_steps) == (100, 40)
    with pytest.raises(SystemExit):  # a warmup given that does not fit is still refused, naming the field
        parse_posttrain(["--train.steps", "10", "--train.warmup_steps", "30"])


def test_a_recipe_that_leaves_warmup_unset_keeps_it_unset():
    train = RECIPES["llama3_debug"]().train
    assert train.warmup_steps is None and scaled_warmup(train, 5) is train
    recipe = RECIPES["llama3_debug"]()
    assert with_steps_scaled(recipe, ["--train.steps", "not-a-number"]) is recipe  # tyro refuses it, by name


def test_flag_value_reads_both_spellings_and_the_last_one_wins():
    argv = ["--train.steps", "7", "--train.steps=9", "--train.warmup_steps", "2"]
    assert flag_value(argv, "--train.steps") == "9"
    assert flag_value(argv, "--train.warmup-steps") == "2"
    assert flag_value(argv, "--data.seq-len") is None
