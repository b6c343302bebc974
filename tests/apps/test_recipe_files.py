"""Recipe files given to --recipe: a run's recipe.json or a TOML file with a base, flags on top, --print-recipe
reading back to the same recipe, and errors that name the file and the field."""

import dataclasses

from titanpod.diffusion.cli import main as diffusion_main
from titanpod.diffusion.command import parse_train
from titanpod.posttrain.cli import main as posttrain_main
from titanpod.posttrain.command import parse_command as parse_posttrain
from titanpod.pretrain.cli import main as pretrain_main
from titanpod.pretrain.command import parse_recipe
from titanpod.recipes import Recipe, get_recipe
from titanpod.recipes.diffusion import DiffusionRecipe
from titanpod.recipes.posttrain.grpo_recipe import GRPORecipe

TOML = """\
base = "qwen3_debug"
name = "my_qwen"

[train]
steps = 7
lr = 0.002
step_mode = "whole_step"

[data]
document_masking = true
"""


def test_a_toml_file_overrides_its_base_and_flags_override_the_file(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(TOML)
    recipe = parse_recipe(["--recipe", str(path), "--train.lr", "0.5", "--data.no-document-masking"])
    base = get_recipe("qwen3_debug")
    train = dataclasses.replace(base.train, steps=7, lr=0.5, step_mode="whole_step")
    assert recipe == dataclasses.replace(base, name="my_qwen", train=train)


def test_a_runs_recipe_json_is_read_back_with_flags_on_top(tmp_path):
    saved = dataclasses.replace(get_recipe("llama3_debug"), name="from_a_run")
    path = tmp_path / "recipe.json"
    path.write_text(saved.to_json())
    recipe = parse_recipe(["--recipe", str(path), "--train.steps", "3"])
    assert recipe == dataclasses.replace(saved, train=dataclasses.replace(saved.train, steps=3))


def test_print_recipe_writes_json_that_reads_back_to_the_same_recipe(tmp_path, capsys):
    path = tmp_path / "mine.toml"
    path.write_text(TOML)
    args = ["--recipe", str(path), "--train.seed", "3", "--kernels.head-loss", "chunked"]
    assert pretrain_main([*args, "--print-recipe"]) == 0
    printed = tmp_path / "printed.json"
    printed.write_text(capsys.readouterr().out)
    assert Recipe.load(printed) == parse_recipe(args)
    assert parse_recipe(["--recipe", str(printed)]) == parse_recipe(args)
    assert not (tmp_path / "runs").exists()  # printing runs nothing


def test_posttrain_and_diffusion_read_recipe_files_and_print_them(tmp_path, capsys):
    grpo = tmp_path / "grpo.toml"
    grpo.write_text('base = "grpo_debug"\n[grpo]\nreward = "exact"\ngroup_size = 4\n')
    command = parse_posttrain(["--recipe", str(grpo), "--grpo.prompts-per-step", "2"])
    assert command is not None and command.kind == "grpo"
    assert (command.recipe.grpo.reward, command.recipe.grpo.group_size, command.recipe.grpo.prompts_per_step) == (
        "exact", 4, 2,
    )  # fmt: skip
    assert posttrain_main(["--recipe", str(grpo), "--print-recipe"]) == 0
    printed = tmp_path / "grpo.json"
    printed.write_text(capsys.readouterr().out)
    assert GRPORecipe.load(printed) == parse_posttrain(["--recipe", str(grpo)]).recipe
    assert parse_posttrain(["--recipe", str(printed)]).kind == "grpo"  # a whole recipe file: kind by its sections

    flux = tmp_path / "flux.toml"
    flux.write_text('base = "flux_debug"\n[samples]\nsteps = 5\n')
    assert diffusion_main(["--recipe", str(flux), "--samples.prompts", "2", "--print-recipe"]) == 0
    printed = tmp_path / "flux.json"
    printed.write_text(capsys.readouterr().out)
    command = parse_train(["--recipe", str(printed)])
    recipe = command.recipe
    assert command.action == "train" and recipe == DiffusionRecipe.load(printed)
    assert (recipe.samples.steps, recipe.samples.prompts) == (5, 2)


def test_bad_recipe_files_are_refused_naming_the_file_and_the_field(tmp_path, capsys):
    cases = {
        "missing.toml": None,
        "typo.toml": 'base = "llama3_debug"\n[train]\nstepz = 3\n',
        "syntax.toml": 'base = "llama3_debug"\n[train\n',
        "choice.toml": 'base = "llama3_debug"\n[kernels]\nattention = "splsh"\n',
        "base.toml": 'base = "llama3_debgu"\n',
        "section.json": '{"train": 5}',
        "hyphen.toml": 'base = "llama3_debug"\n[train]\nwarmup-steps = 3\n',
    }
    expected = {
        "missing.toml": "no such recipe file",
        "typo.toml": "Unknown fields in recipe.train: stepz (did you mean steps?)",
        "syntax.toml": "is not valid TOML",
        "choice.toml": (
            "recipe.kernels.attention must be one of sdpa, splash, splash_sdpa, cpu_flash, math; got 'splsh'"
        ),
        "base.toml": "Did you mean 'llama3_debug'",
        "section.json": "recipe.train is a section of fields",
        "hyphen.toml": "Unknown fields in recipe.train: warmup-steps (did you mean warmup_steps?)",
    }
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        assert pretrain_main(["--recipe", str(path)]) == 2, name
        err = " ".join(capsys.readouterr().err.split())
        assert str(path) in err.replace(" ", "") or name in err, err
        assert expected[name] in err, err
    assert not (tmp_path / "runs").exists()


def test_a_recipe_file_that_shortens_the_run_keeps_its_warmup_share_unless_it_sets_one(tmp_path):
    short = tmp_path / "short.toml"
    short.write_text('base = "sft_debug"\n[train]\nsteps = 10\n')  # sft_debug warms up 30 of 300 steps
    assert parse_posttrain(["--recipe", str(short)]).recipe.train.warmup_steps == 1
    own = tmp_path / "own.toml"
    own.write_text('base = "sft_debug"\n[train]\nsteps = 10\nwarmup_steps = 4\n')
    assert parse_posttrain(["--recipe", str(own)]).recipe.train.warmup_steps == 4
