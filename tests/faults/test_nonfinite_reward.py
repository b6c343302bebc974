"""A reward function that returns NaN: refused before any work when it does so on the first training prompt's
answer, and otherwise stopped at the first step with the function named and the fix, exiting non-zero with the
policy unchanged; each skipped sample's message says the reward returned NaN, not that it raised."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from tests.rl.tiny_policy import write_tiny_policy
from titanpod.checkpoint import CheckpointConfig, load_model
from titanpod.recipes.posttrain.grpo_recipe import GRPOConfig, GRPOModelConfig, GRPORecipe
from titanpod.recipes.posttrain.registry import grpo_debug
from titanpod.recipes.posttrain.sft_recipe import EvalConfig
from titanpod.recipes.recipe import OutputConfig
from titanpod.rl.grpo.run import run_grpo
from titanpod.rl.rollout import trainer_state, weights_checksum


@pytest.fixture(scope="module")
def sft_folder(tmp_path_factory):
    """A titanpod model folder with random weights and the character tokenizer, as an SFT run leaves it."""
    return write_tiny_policy(tmp_path_factory.mktemp("sft") / "model")


def recipe(runs, folder, name: str, reward_function: str | None = None) -> GRPORecipe:
    """Three GRPO steps of the tiny model (two prompts of three completions each), no held-out scoring."""
    return dataclasses.replace(
        grpo_debug(),
        model=GRPOModelConfig(init_from=str(folder)),
        grpo=GRPOConfig(group_size=3, prompts_per_step=2, max_new_tokens=4, reward_function=reward_function),
        train=dataclasses.replace(grpo_debug().train, steps=3, lr=1e-2, warmup_steps=0),
        eval=EvalConfig(examples=2, max_new_tokens=4, show=0, before=False),
        checkpoint=CheckpointConfig(export_hf=False),
        output=OutputConfig(runs_dir=str(runs), run_name=name, tensorboard=False),
    )


def test_a_reward_returning_nan_on_the_answer_is_refused_before_any_work(tmp_path, sft_folder):
    (tmp_path / "nan_rewards.py").write_text("def score(prompt, completion, row):\n    return float('nan')\n")
    spec = f"{tmp_path / 'nan_rewards.py'}:score"
    with pytest.raises(ValueError, match=r"reward function .*nan_rewards.py:score returned nan .*finite") as error:
        run_grpo(recipe(tmp_path / "runs", sft_folder, "nan", spec))
    assert "never NaN or infinity" in str(error.value)
    assert not (tmp_path / "runs" / "nan").exists()  # refused before the run directory is written


def test_a_reward_returning_nan_on_every_completion_stops_the_run_at_step_1(tmp_path, sft_folder):
    def nan_for_completions(prompt, completion, answer):
        return math.nan  # the answer-only start-up check cannot see this one: it is given as a function

    result = run_grpo(recipe(tmp_path, sft_folder, "nan"), reward=nan_for_completions)
    assert result.exit_code == 1 and result.steps_done == 1  # stopped, not finished with nothing learned
    assert result.stopped_because.startswith("step 1: the reward function ")
    assert "nan_for_completions gave none of the step's 6 completions a finite reward" in result.stopped_because
    assert "return a finite float for every completion" in result.stopped_because
    row = result.history[0]
    assert row.skipped == 6 and row.loss is None
    assert all("returned nan (not a finite number)" in message for message in row.reward_errors)
    assert not any("raised" in message for message in row.reward_errors)
    _, start = load_model(sft_folder)
    assert result.checksum == weights_checksum(trainer_state(start))  # nothing was updated
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "samples" in row] == [1]  # no step after the first


def test_a_reward_returning_nan_on_some_completions_skips_only_those(tmp_path, sft_folder):
    calls = []

    def sometimes_nan(prompt, completion, answer):
        calls.append(completion)
        return math.nan if len(calls) % 3 == 0 else float(len(calls) % 2)

    result = run_grpo(recipe(tmp_path, sft_folder, "some"), reward=sometimes_nan)
    assert result.exit_code == 0 and result.steps_done == 3 and result.stopped_because is None
    assert result.skipped_samples == 6  # 2 of each step's 6
    assert all(row.loss is not None for row in result.history)
