"""A reward function that returns NaN or an absurd number: refused before any work when it does so on the first
training prompt's answer, and otherwise stopped at whichever step it first does, with the step, the sample, the
value, the function and the fix named, exiting non-zero with that step untrained and the steps before it kept."""

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


def test_a_reward_that_turns_nan_after_step_1_stops_the_run_in_step_2(tmp_path, sft_folder):
    calls = []

    def nan_after_step_1(prompt, completion, answer):
        calls.append((prompt, completion))
        return math.nan if len(calls) > 6 else float(len(calls) % 2)  # six completions a step

    result = run_grpo(recipe(tmp_path, sft_folder, "nan"), reward=nan_after_step_1)
    assert result.exit_code == 1 and result.steps_done == 1  # stopped, not finished with nothing learned
    message = result.stopped_because
    assert message.startswith("step 2 (not trained on; the run stopped): the reward function ")
    assert "nan_after_step_1 returned nan on prompt 0, completion 0 of the step" in message
    prompt, completion = calls[-1]
    assert repr(prompt[:20])[1:-1] in message and repr(completion[:20])[1:-1] in message
    assert "return a finite float for every completion" in message
    assert len(calls) == 7  # nothing scored after the NaN
    assert [row.step for row in result.history] == [1]
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "samples" in row] == [1]
    assert (result.run_dir / "checkpoints" / "step-000001").is_dir()
    _, saved = load_model(result.weights_path.parent)
    assert weights_checksum(trainer_state(saved)) == result.history[0].checksum  # the weights after step 1


def test_an_absurd_reward_stops_the_run_in_step_1_with_the_policy_unchanged(tmp_path, sft_folder):
    value = 1e308  # finite, but a group's mean and spread overflow to NaN (each limit: test_reward_import)

    def huge(prompt, completion, answer):
        return value

    result = run_grpo(recipe(tmp_path, sft_folder, "huge"), reward=huge)
    assert result.exit_code == 1 and result.steps_done == 0 and result.history == []
    assert f"huge returned {value} on prompt 0, completion 0 of the step" in result.stopped_because
    assert "no larger than 1e+06 in size" in result.stopped_because
    assert result.weights_path is None  # nothing was trained, so nothing is written as the result
    _, start = load_model(sft_folder)
    assert result.checksum == weights_checksum(trainer_state(start))
