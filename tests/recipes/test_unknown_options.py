"""An option a command does not have is named in one line with the closest options it has, before tyro's own
listing: the option names titanpod checks are exactly the ones tyro makes for each command."""

from __future__ import annotations

import warnings

import pytest
import tyro

from titanpod.diffusion import command as diffusion
from titanpod.posttrain import command as posttrain
from titanpod.pretrain import command as pretrain
from titanpod.recipes import get_recipe
from titanpod.recipes.command_line import PlainHelpRegistry, option_names
from titanpod.recipes.diffusion.registry import get_diffusion_recipe
from titanpod.recipes.posttrain.registry import grpo_debug, sft_debug
from titanpod.recipes.recipe import Recipe


def tyro_options(kind: type, default: object) -> set[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # get_parser: the one way to list tyro's options
        parser = tyro.extras.get_parser(kind, default=default, registry=PlainHelpRegistry())
    return set(parser._option_string_actions)


@pytest.mark.parametrize(
    ("kind", "default", "recipe_type"),
    [
        (pretrain.Command, pretrain.Command(recipe=get_recipe("llama3_debug"), recipe_name="r"), Recipe),
        (posttrain.Command[type(sft_debug())], posttrain.Command(recipe=sft_debug(), recipe_name="r"),
         type(sft_debug())),
        (posttrain.Command[type(grpo_debug())], posttrain.Command(recipe=grpo_debug(), recipe_name="r"),
         type(grpo_debug())),
        (diffusion.TrainCommand, diffusion.TrainCommand(recipe=get_diffusion_recipe("flux_debug"), recipe_name="r"),
         type(get_diffusion_recipe("flux_debug"))),
    ],
)  # fmt: skip
def test_the_options_checked_are_the_ones_tyro_makes(kind, default, recipe_type):
    assert option_names(recipe_type) | option_names(kind) | {"-h", "--help"} == tyro_options(kind, default)


def test_a_misspelled_option_is_named_with_the_closest_first(capsys):
    with pytest.raises(SystemExit) as stopped:
        pretrain.parse_command(["--train.step", "5"])
    assert stopped.value.code == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "has no option --train.step." in said
    assert said.index("--train.steps") < said.index("--help")
    assert said.split("Did you mean ")[1].startswith("--train.steps")


def test_options_given_with_underscores_or_values_still_parse():
    command = pretrain.parse_command(["--train.log_every", "3", "--checkpoint.async-save", "False"])
    assert command is not None and command.recipe.train.log_every == 3
    assert command.recipe.checkpoint.async_save is False
