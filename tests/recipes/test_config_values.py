"""Each config refuses the values a run cannot train with, by type and range, naming the field as a recipe
spells it; a recipe checks every section, also those without checks of their own."""

from __future__ import annotations

import dataclasses
import re

import pytest

from titanpod.checkpoint import CheckpointConfig
from titanpod.data.config import DataConfig
from titanpod.graph import TrainConfig
from titanpod.parallel import ParallelConfig
from titanpod.recipes.recipe import OutputConfig, Recipe


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TrainConfig(steps="100"), "train.steps must be a whole number, got '100'"),
        (lambda: TrainConfig(lr=float("nan")), "train.lr must be a finite number, got nan"),
        (lambda: TrainConfig(eps=0.0), "train.eps must be above 0"),
        (lambda: TrainConfig(weight_decay=-0.1), "train.weight_decay must be at least 0"),
        (lambda: TrainConfig(grad_clip=float("inf")), "train.grad_clip must be a finite number"),
        (lambda: TrainConfig(min_lr_ratio=1.5), "train.min_lr_ratio must be at least 0 and at most 1"),
        (lambda: TrainConfig(seed=-1), "train.seed must be at least 0"),
        (lambda: TrainConfig(skip_nonfinite="no"), "train.skip_nonfinite must be true or false"),
        (lambda: DataConfig(batch_size=2.0), "data.batch_size must be a whole number, got 2.0"),
        (lambda: DataConfig(validation_fraction=float("nan")), "data.validation_fraction must be a finite number"),
        (lambda: CheckpointConfig(every="4"), "checkpoint.every must be a whole number, got '4'"),
    ],
)
def test_each_config_refuses_a_value_it_cannot_run_with(build, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        build()


def test_a_recipe_file_value_is_checked_before_its_section_is_built():
    data = Recipe().to_dict()
    data["target"]["chips"] = "8"  # TargetConfig would compare it with 1 first
    with pytest.raises(ValueError, match=r"^target\.chips must be a whole number, got '8'"):
        Recipe.from_dict(data)


def test_a_recipe_checks_the_sections_that_have_no_checks_of_their_own():
    with pytest.raises(ValueError, match=r"^parallel\.tp must be a whole number, got '2'"):
        dataclasses.replace(Recipe(), parallel=ParallelConfig(tp="2"))
    with pytest.raises(ValueError, match=r"^output\.save_weights must be true or false, got 'no'"):
        dataclasses.replace(Recipe(), output=OutputConfig(save_weights="no"))
