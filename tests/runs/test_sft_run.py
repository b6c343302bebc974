"""SFT runs in process: a run stopped and resumed ends with exactly the weights of one that never stopped;
bad starting points are refused with the fix."""

import dataclasses
import json

import pytest
import torch

from titanpod.checkpoint import CheckpointConfig, load_model
from titanpod.graph import TrainConfig
from titanpod.recipes.posttrain.registry import sft_debug
from titanpod.recipes.posttrain.sft_recipe import EvalConfig, SFTDataConfig, SFTModelConfig, SFTRecipe
from titanpod.recipes.recipe import OutputConfig
from titanpod.runs.loss_plot import read_loss_history
from titanpod.runs.sft import run_sft


def tiny(tmp_path, run_name: str, **train) -> SFTRecipe:
    recipe = sft_debug()
    return dataclasses.replace(
        recipe,
        data=SFTDataConfig(train_examples=64, seq_len=32, batch_size=2),
        train=TrainConfig(**{"steps": 6, "warmup_steps": 1, "log_every": 2, "lr": 3e-3, **train}),
        eval=EvalConfig(enabled=False),
        checkpoint=CheckpointConfig(at_end=True, export_hf=False),
        output=OutputConfig(runs_dir=str(tmp_path), run_name=run_name, tensorboard=False),
    )


def test_a_stopped_and_resumed_run_ends_with_the_weights_of_an_unbroken_one(tmp_path):
    whole = run_sft(tiny(tmp_path, "whole"))
    first = run_sft(tiny(tmp_path, "split", stop_at_step=3))
    assert first.summary.steps_done == 3 and (tmp_path / "split" / "checkpoints" / "step-000003").is_dir()
    rest = run_sft(tiny(tmp_path, "split"))
    assert rest.summary.start_step == 3 and rest.summary.steps_done == 6
    assert rest.summary.losses == whole.summary.losses[3:]
    history = read_loss_history(tmp_path / "split" / "metrics.jsonl")  # what split/loss.png draws
    assert (tmp_path / "split" / "loss.png").is_file() and history.steps == [2, 3, 4, 6]  # stopped at 3, resumed
    unbroken = {report.step: report.loss for report in whole.summary.reports}
    assert history.losses[0] == unbroken[2] and history.losses[-1] == unbroken[6]
    _, expected = load_model(whole.weights_path.parent)
    _, resumed = load_model(rest.weights_path.parent)
    for (name, a), (_, b) in zip(expected.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_starting_points_that_do_not_fit_are_refused(tmp_path):
    recipe = tiny(tmp_path, "bad")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"holds neither model.json .* nor config.json"):
        run_sft(dataclasses.replace(recipe, model=SFTModelConfig(init_from=str(empty))))
    done = run_sft(dataclasses.replace(recipe, train=TrainConfig(steps=2, warmup_steps=0)))
    other_family = SFTModelConfig(family="qwen3", init_from=str(done.weights_path.parent))
    followed = run_sft(
        dataclasses.replace(
            recipe,
            model=other_family,
            train=TrainConfig(steps=1, warmup_steps=0),
            output=dataclasses.replace(recipe.output, run_name="followed"),
        )
    )  # the folder's family, not the recipe's
    assert json.loads((followed.run_dir / "recipe.json").read_text(encoding="utf-8"))["model"]["family"] == "llama3"
    with pytest.raises(ValueError, match="longer than the model's max_seq_len 512"):
        run_sft(dataclasses.replace(recipe, data=SFTDataConfig(seq_len=1024)))


def test_a_resumed_run_keeps_the_accuracy_its_start_had(tmp_path):
    def scored(name: str, **train) -> SFTRecipe:
        return dataclasses.replace(tiny(tmp_path, name, **train), eval=EvalConfig(examples=4, max_new_tokens=4))

    whole = run_sft(scored("whole"))
    run_sft(scored("split", stop_at_step=3))
    rest = run_sft(scored("split"))
    assert rest.before == whole.before and rest.before.step == 0  # not the resumed weights scored at step 3
    kept, unbroken = (json.loads((tmp_path / name / "eval.json").read_text()) for name in ("split", "whole"))
    assert kept["before"] == unbroken["before"] and kept["after"] == unbroken["after"]
