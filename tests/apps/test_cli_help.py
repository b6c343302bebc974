"""The three commands' flags as a user meets them: every option in --help with its choices, choices checked while
parsing, booleans as --x / --no-x flags (and the older --x True form), help text without raw markup."""

import typing

import pytest

from titanpod.data.sft.config import TaskName
from titanpod.data.tasks import TASKS
from titanpod.device import LANES
from titanpod.device.config import LaneChoice
from titanpod.diffusion.cli import main as diffusion_main
from titanpod.models.flux.args import FLUX_FLAVORS
from titanpod.posttrain.cli import main as posttrain_main
from titanpod.posttrain.command import parse_command as parse_posttrain
from titanpod.pretrain.cli import main as pretrain_main
from titanpod.pretrain.command import parse_command, parse_recipe
from titanpod.recipes.command_line import flags_from_values
from titanpod.recipes.diffusion.recipe import FluxFlavor


def help_text(main, args, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "250")  # one option per line, so choices are not wrapped
    with pytest.raises(SystemExit) as exited:
        main([*args, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_pretrain_help_lists_every_flag_and_the_choices_without_raw_backticks(capsys, monkeypatch):
    text = help_text(pretrain_main, [], capsys, monkeypatch)
    for flag in ("--recipe", "--list-recipes", "--print-recipe", "--resume", "--dry-run", "--rehearse ",
                 "--rehearse-lanes", "--chip ", "--chips ", "--train.steps"):  # fmt: skip
        assert flag in text, flag
    assert "--train.step-mode {eager,per_block,whole_step}" in text
    assert "--kernels.attention {sdpa,splash,splash_sdpa,cpu_flash,math}" in text
    assert "--device.lane {auto,cpu,cuda,xla,tpu,torch_xla}" in text
    assert "--checkpoint.async-save, --checkpoint.no-async-save" in text
    assert "``" not in text
    assert "auto, cpu, cuda, xla, tpu or torch_xla. Anything but auto wins" in text  # one paragraph, plain


def test_help_shows_the_defaults_of_the_recipe_chosen(capsys, monkeypatch):
    text = help_text(pretrain_main, ["--recipe", "qwen3_debug"], capsys, monkeypatch)
    family = text[text.index("--model.family") : text.index("--model.flavor")]
    assert "(default: qwen3)" in family


def test_posttrain_and_diffusion_help_list_their_flags_and_choices(capsys, monkeypatch):
    posttrain = help_text(posttrain_main, ["--recipe", "grpo_debug"], capsys, monkeypatch)
    for flag in ("--recipe", "--list-recipes", "--print-recipe", "--resume", "--rollout.mode {local,ray,vllm}",
                 "--grpo.reward {exact,partial,number}", "--grpo.task {reverse,add,arith}", "--grpo.data-path",
                 "--grpo.eval-path", "--grpo.prompt-column", "--grpo.answer-column", "--grpo.reward-function",
                 "--grpo.data-split", "--grpo.eval-split", "--grpo.reward-timeout-s"):  # fmt: skip
        assert flag in posttrain, flag
    assert "module:function" in posttrain and "hub:owner/name" in posttrain  # the new fields' docstrings
    diffusion = help_text(diffusion_main, [], capsys, monkeypatch)
    for flag in ("--recipe", "--list-recipes", "--print-recipe", "--dry-run", "--rehearse", "--chips ",
                 "--data.source {shapes,imagefolder,hub}", "--model.flavor {debug,schnell,dev}",
                 "--model.recompute-blocks, --model.no-recompute-blocks"):  # fmt: skip
        assert flag in diffusion, flag
    sample = help_text(diffusion_main, ["sample"], capsys, monkeypatch)
    for flag in ("--checkpoint", "--prompt", "--steps", "--cfg-scale", "--cfg-stop", "--seed", "--out"):
        assert flag in sample, flag
    assert "``" not in posttrain + diffusion + sample


def test_a_misspelt_choice_fails_while_parsing_and_names_the_choices(capsys):
    with pytest.raises(SystemExit) as exited:
        parse_command(["--train.step-mode", "wholestep"])
    assert exited.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "'wholestep'" in err and "whole_step" in err and "per_block" in err
    with pytest.raises(SystemExit):
        parse_posttrain(["--recipe", "grpo_debug", "--rollout.mode", "rey"])
    assert "vllm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        diffusion_main(["--data.source", "shape"])
    assert "imagefolder" in capsys.readouterr().err


def test_booleans_are_flags_with_no_forms_and_the_older_value_form_still_reads():
    recipe = parse_recipe(["--checkpoint.no-at-end", "--data.document-masking", "--output.no-tensorboard"])
    assert recipe is not None
    assert not recipe.checkpoint.at_end and recipe.data.document_masking and not recipe.output.tensorboard
    older = parse_recipe(["--checkpoint.at-end", "False", "--data.document-masking", "True",
                          "--output.tensorboard=false"])  # fmt: skip
    assert older == recipe
    command = parse_command(["--dry-run", "--chips", "4", "--rehearse-lanes", "cpu,xla"])
    assert command is not None and command.dry_run and not command.rehearse
    assert command.recipe.target.chips == 4 and command.rehearse_lanes == ("cpu", "xla")


def test_flag_values_are_rewritten_only_for_boolean_flags():
    flags = {"--resume": None, "--checkpoint.async-save": "--checkpoint.no-async-save"}
    argv = ["--resume", "False", "--checkpoint.async_save", "no", "--output.run-name", "True", "--resume", "1"]
    assert flags_from_values(argv, flags) == ["--checkpoint.no-async-save", "--output.run-name", "True", "--resume"]


def test_the_literal_choices_match_the_registries_they_name():
    assert typing.get_args(LaneChoice) == ("auto", *LANES)
    assert set(typing.get_args(TaskName)) == set(TASKS)
    assert set(typing.get_args(FluxFlavor)) == set(FLUX_FLAVORS)
