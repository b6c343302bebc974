"""A reward function that hangs, calls sys.exit or raises on a whole step: the run stops with the function named
and the fix, exits non-zero, and keeps what a stopped run keeps (the checkpoint and weights of the steps it
trained); one that raises on a few samples only has them skipped, and each such step says how many."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from rich.console import Console

from tests.rl.tiny_policy import write_tiny_policy
from titanpod.checkpoint import CheckpointConfig, load_model
from titanpod.recipes.posttrain.grpo_recipe import GRPOConfig, GRPOModelConfig, GRPORecipe
from titanpod.recipes.posttrain.registry import grpo_debug
from titanpod.recipes.posttrain.sft_recipe import EvalConfig
from titanpod.recipes.recipe import OutputConfig
from titanpod.rl.grpo.run import run_grpo
from titanpod.rl.rollout import trainer_state, weights_checksum

STEP = 2 * 3
"""Reward calls of one step: two prompts of three completions each."""


@pytest.fixture(scope="module")
def sft_folder(tmp_path_factory):
    """A titanpod model folder with random weights and the character tokenizer, as an SFT run leaves it."""
    return write_tiny_policy(tmp_path_factory.mktemp("sft") / "model")


def recipe(runs, folder, name: str, steps: int = 2, **grpo) -> GRPORecipe:
    """``steps`` GRPO steps of the tiny model (two prompts of three completions each), no held-out scoring."""
    return dataclasses.replace(
        grpo_debug(),
        model=GRPOModelConfig(init_from=str(folder)),
        grpo=GRPOConfig(group_size=3, prompts_per_step=2, max_new_tokens=4, **grpo),
        train=dataclasses.replace(grpo_debug().train, steps=steps, lr=1e-2, warmup_steps=0),
        eval=EvalConfig(enabled=False),
        checkpoint=CheckpointConfig(export_hf=False),
        output=OutputConfig(runs_dir=str(runs), run_name=name, tensorboard=False),
    )


def steps_written(run_dir) -> list[int]:
    """The steps metrics.jsonl holds a line of."""
    return [row["step"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def assert_kept_step_1(result) -> None:
    """``result`` stopped non-zero in step 2 and kept step 1: its checkpoint, its weights, its metrics line only."""
    assert result.exit_code == 1 and result.steps_done == 1 and not result.interrupted
    assert result.stopped_because.startswith("step 2 (not trained on; the run stopped): the reward function ")
    assert (result.run_dir / "checkpoints" / "step-000001" / "trainer.json").is_file()
    assert not (result.run_dir / "checkpoints" / "step-000002").exists()
    assert steps_written(result.run_dir) == [1]
    _, saved = load_model(result.weights_path.parent)
    assert weights_checksum(trainer_state(saved)) == result.history[-1].checksum  # the weights after step 1


def test_a_reward_that_hangs_stops_the_run_after_its_timeout_keeping_the_steps_before(tmp_path, sft_folder):
    release = threading.Event()
    calls = []

    def hangs_in_step_2(prompt, completion, answer):
        calls.append(completion)
        if len(calls) > STEP:
            release.wait(60)  # a judge that never answers (let go when the test ends)
        return float(len(calls) % 2)

    try:
        result = run_grpo(recipe(tmp_path, sft_folder, "hang", reward_timeout_s=0.5), reward=hangs_in_step_2)
    finally:
        release.set()
    assert_kept_step_1(result)
    assert len(calls) == STEP + 1  # the first call of step 2 was given up on, and none made after it
    message = result.stopped_because
    assert "hangs_in_step_2 did not return within 0.5 s on prompt 0, completion 0 of the step" in message
    assert repr(calls[-1][:40])[1:-1] in message  # the start of the completion it hung on
    assert "--grpo.reward-timeout-s (now 0.5)" in message


def test_a_reward_that_calls_sys_exit_stops_the_run_non_zero_keeping_the_steps_before(tmp_path, sft_folder):
    calls = []

    def exits_in_step_2(prompt, completion, answer):
        calls.append(prompt)
        if len(calls) > STEP:
            sys.exit(0)
        return float(len(calls) % 2)

    result = run_grpo(recipe(tmp_path, sft_folder, "exit"), reward=exits_in_step_2)
    assert_kept_step_1(result)
    assert "exits_in_step_2 called sys.exit(0) on prompt 0, completion 0 of the step" in result.stopped_because
    assert repr(calls[-1][:20])[1:-1] in result.stopped_because  # the start of the prompt
    assert "Return a number" in result.stopped_because


def test_a_reward_raising_on_some_samples_is_counted_each_step_and_on_a_whole_step_stops_the_run(tmp_path, sft_folder):
    calls = []

    def judge_goes_down(prompt, completion, answer):
        calls.append(prompt)
        if len(calls) % 3 == 0 or len(calls) > 2 * STEP:  # a few samples of steps 1 and 2, then every one
            raise ConnectionError("judge unreachable")
        return float(len(calls) % 2)

    console = Console(record=True, width=400)
    result = run_grpo(recipe(tmp_path, sft_folder, "down", steps=4), console=console, reward=judge_goes_down)
    said = console.export_text()
    counted = [line for line in said.splitlines() if "judge_goes_down raised on 2 of the step's 6 completions" in line]
    assert [line.split(":")[0] for line in counted] == ["step 1", "step 2"]  # one line for each step
    assert all("they were left out of the update (not scored 0)" in line for line in counted)
    assert [row.skipped for row in result.history] == [2, 2, 6]
    assert result.exit_code == 1 and result.steps_done == 3 and result.skipped_samples == 10
    assert result.stopped_because.startswith("step 3: the reward function ")
    assert "judge_goes_down raised on every one of the step's 6 completions" in result.stopped_because
    assert "raised on 6 of" not in said  # a whole step is said once, by the stop
    assert "ConnectionError: judge unreachable" in result.stopped_because
    assert steps_written(result.run_dir) == [1, 2, 3]  # no step 4
    assert (result.run_dir / "checkpoints" / "step-000003").is_dir()


HANGING_REWARD = textwrap.dedent(
    """
    import threading

    def score(prompt, completion, row):
        if completion == row["a"]:  # the check before training, which gives the answer as the completion
            return 1.0
        threading.Event().wait()  # a judge that never answers
    """
)


@pytest.mark.slow
def test_a_hanging_reward_ends_the_process_non_zero_with_the_function_and_the_flag(tmp_path, sft_folder):
    rows = [{"q": f"{a}+{a}=", "a": str(2 * a)} for a in range(20)]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "judge.py").write_text(HANGING_REWARD)
    args = [
        "--recipe", "grpo_debug", "--model.init-from", str(sft_folder), "--grpo.data-path", "sums.jsonl",
        "--grpo.prompt-column", "q", "--grpo.answer-column", "a", "--train.steps", "2", "--grpo.prompts-per-step",
        "2", "--grpo.group-size", "2", "--grpo.max-new-tokens", "4", "--eval.enabled", "False", "--device.lane",
        "cpu", "--grpo.reward-function", "judge.py:score", "--grpo.reward-timeout-s", "0.5", "--output.run-name",
        "hung",
    ]  # fmt: skip
    # The reward's thread never ends: the process must end anyway (the guard only keeps a failure from hanging).
    done = subprocess.run(
        [sys.executable, "-m", "titanpod.posttrain.cli", *args], capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "400"}, timeout=300, check=False,
    )  # fmt: skip
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, said
    stopped = "step 1 (not trained on; the run stopped): the reward function judge.py:score did not return within 0.5 s"
    assert stopped in said
    assert "--grpo.reward-timeout-s (now 0.5)" in said
    assert not (tmp_path / "runs" / "hung" / "checkpoints").exists()  # nothing was trained, so nothing to keep
