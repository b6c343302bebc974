"""``--list-recipes`` shows each recipe's whole first sentence; ``--resume NAME`` finds a run by its folder or by
the name it was run as, and ``--resume`` alone finds the newest run of the recipe, named or not."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from titanpod.diffusion.cli import main as diffusion_main
from titanpod.posttrain.cli import main as posttrain_main
from titanpod.pretrain.command import parse_command
from titanpod.recipes import RECIPES
from titanpod.recipes.command_line import first_sentence, optional_value
from titanpod.recipes.diffusion.registry import DIFFUSION_RECIPES
from titanpod.recipes.posttrain.registry import POSTTRAIN_RECIPES
from titanpod.runs.run_lookup import find_run, latest_resumable_run, with_resume


def test_first_sentence_stops_at_the_first_sentence_end_only():
    assert first_sentence("Llama 3.1 405B on\n    v5p-1024 (512 chips): FSDP. Only activations cross.") == (
        "Llama 3.1 405B on v5p-1024 (512 chips): FSDP."
    )
    assert first_sentence("Kernels, e.g. Splash, i.e. fast. More.") == "Kernels, e.g. Splash, i.e. fast."
    assert first_sentence("FLUX.1-dev at 1024x1024: bf16") == "FLUX.1-dev at 1024x1024: bf16"  # no end: all of it
    assert first_sentence("Trains (see runs/<sft run>/model). 60 steps.") == "Trains (see runs/<sft run>/model)."
    assert first_sentence(None) == ""


@pytest.mark.parametrize(
    ("main", "recipes", "descriptions"),
    [
        (lambda: parse_command(["--list-recipes"]), RECIPES, lambda build: build.__doc__),
        (lambda: diffusion_main(["--list-recipes"]), DIFFUSION_RECIPES, lambda build: build.__doc__),
        (lambda: posttrain_main(["--list-recipes"]), POSTTRAIN_RECIPES, lambda entry: entry.description),
    ],
)
def test_list_recipes_shows_whole_first_sentences_as_plain_text(capsys, main, recipes, descriptions):
    main()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(recipes)
    for line, (name, entry) in zip(lines, recipes.items(), strict=True):
        whole = " ".join(descriptions(entry).split())
        assert line.startswith(name) and line.endswith(first_sentence(whole).replace("``", ""))
        assert "``" not in line  # code spans shown as --help shows them, without their double backticks
        assert line[-1] in ".!?" or first_sentence(whole) == whole  # never cut mid-sentence


def test_resume_takes_a_name_or_none_and_the_older_boolean_form():
    assert optional_value(["--resume"], "--resume") == ["--resume", ""]
    assert optional_value(["--resume", "--train.steps", "4"], "--resume") == ["--resume", "", "--train.steps", "4"]
    assert optional_value(["--resume", "try1"], "--resume") == ["--resume", "try1"]
    assert optional_value(["--resume", "True", "--x"], "--resume") == ["--resume", "", "--x"]
    assert optional_value(["--resume", "no", "--x"], "--resume") == ["--x"]


def make_run(runs: Path, folder: str, recipe: str = "llama3_debug", run_name: str | None = None, step: int = 0) -> Path:
    """A run directory with its recipe.json, and a complete checkpoint at ``step`` (none for 0)."""
    run = runs / folder
    run.mkdir(parents=True)
    (run / "recipe.json").write_text(json.dumps({"name": recipe, "output": {"run_name": run_name}}))
    if step:
        checkpoint = run / "checkpoints" / f"step-{step:06d}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "trainer.json").write_text("{}")
    return run


def test_resume_name_finds_the_folder_or_the_run_name_it_was_run_as(tmp_path):
    make_run(tmp_path, "try1", run_name="try1", step=2)
    make_run(tmp_path, "moved", run_name="exp", step=2)  # a run folder renamed after its run
    make_run(tmp_path, "copy-a", run_name="twice")
    make_run(tmp_path, "copy-b", run_name="twice")
    assert find_run(tmp_path, "try1") == "try1"
    assert find_run(tmp_path, "exp") == "moved"
    with pytest.raises(ValueError, match=r"several runs .* \(copy-a, copy-b\): give the folder .* --resume copy-b"):
        find_run(tmp_path, "twice")
    with pytest.raises(ValueError, match=r"no run under .* is named nope \(runs there: copy-a, copy-b, moved, try1\)"):
        find_run(tmp_path, "nope")


def test_the_command_line_resumes_a_run_by_name(tmp_path):
    make_run(tmp_path, "moved", run_name="exp", step=2)
    command = parse_command(["--resume", "exp", "--output.runs-dir", str(tmp_path)])
    assert command is not None
    assert command.recipe.output.run_name == "moved" and command.recipe.checkpoint.resume == "auto"
    named = parse_command(["--output.run-name", "moved", "--resume", "--output.runs-dir", str(tmp_path)])
    assert named is not None and named.recipe.output.run_name == "moved"  # today's form still works
    with pytest.raises(ValueError, match=r"--resume exp and --output.run-name other name two runs"):
        parse_command(["--resume", "exp", "--output.run-name", "other", "--output.runs-dir", str(tmp_path)])


def test_resume_alone_takes_the_newest_run_of_the_recipe_named_or_not(tmp_path):
    command = parse_command(["--output.runs-dir", str(tmp_path)])
    assert command is not None and command.resume is None
    recipe = command.recipe
    older = make_run(tmp_path, "llama3_debug-20260101-000000", step=2)
    newer = make_run(tmp_path, "my-named-run", run_name="my-named-run", step=4)
    make_run(tmp_path, "qwen-run", recipe="qwen3_debug", step=6)  # another recipe's
    make_run(tmp_path, "no-checkpoint", run_name="no-checkpoint")
    for age, run in ((200, older), (100, newer)):
        for path in (run / "checkpoints").iterdir():
            os.utime(path, (path.stat().st_atime - age, path.stat().st_mtime - age))
    assert latest_resumable_run(recipe) == "my-named-run"
    assert with_resume(recipe).output.run_name == "my-named-run"
    os.utime(next((older / "checkpoints").iterdir()))  # the timestamped run checkpointed last
    assert latest_resumable_run(recipe) == "llama3_debug-20260101-000000"
