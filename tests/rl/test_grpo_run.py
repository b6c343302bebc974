"""GRPO runs in process on a tiny random model with the character tokenizer: the engine holds the trainer's
weights after every step, a raising reward is counted as skipped, bad starting points are refused with the fix,
the reward rises, and a stopped run resumes exactly."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch
from rich.console import Console
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.rl.tiny_policy import write_tiny_policy
from titanpod.checkpoint import CheckpointConfig, load_model
from titanpod.data.sft.tokenizer import load_sft_tokenizer
from titanpod.data.tasks import Example, get_task
from titanpod.graph import ProfileConfig
from titanpod.recipes.posttrain.grpo_recipe import GRPOConfig, GRPOModelConfig, GRPORecipe
from titanpod.recipes.posttrain.registry import POSTTRAIN_RECIPES, grpo_debug
from titanpod.recipes.posttrain.rollout_config import RolloutConfig
from titanpod.recipes.posttrain.sft_recipe import EvalConfig
from titanpod.recipes.recipe import OutputConfig
from titanpod.rl.grpo import trainer as grpo_trainer
from titanpod.rl.grpo.batches import with_policy_logprobs
from titanpod.rl.grpo.held_out import sampled_accuracy
from titanpod.rl.grpo.run import run_grpo
from titanpod.rl.grpo.setup import check_launch
from titanpod.rl.rollout import BuiltinEngine, Completion, trainer_state, weights_checksum
from titanpod.rl.rollout.ray_rollout import import_ray


@pytest.fixture(scope="module")
def sft_folder(tmp_path_factory):
    """A titanpod model folder with random weights and the character tokenizer, as an SFT run leaves it."""
    return write_tiny_policy(tmp_path_factory.mktemp("sft") / "model")


def tiny(tmp_path, folder, run_name: str, steps: int = 2, train: dict | None = None, **grpo) -> GRPORecipe:
    """A GRPO recipe for the tiny model: ``grpo`` and ``train`` override the small defaults."""
    train = {"steps": steps, "lr": 1e-2, "warmup_steps": 0, **(train or {})}
    return dataclasses.replace(
        grpo_debug(),
        model=GRPOModelConfig(init_from=None if folder is None else str(folder)),
        grpo=GRPOConfig(**{"group_size": 3, "prompts_per_step": 2, "max_new_tokens": 4, **grpo}),
        train=dataclasses.replace(grpo_debug().train, **train),
        eval=EvalConfig(examples=4, max_new_tokens=4, show=1),
        checkpoint=CheckpointConfig(export_hf=False),
        output=OutputConfig(runs_dir=str(tmp_path), run_name=run_name, tensorboard=False),
    )


def test_a_step_trains_and_the_engine_holds_the_trainers_weights(tmp_path, sft_folder):
    # Half of the samples earn 1, so every group has signal; the KL term runs with a reference model.
    calls = []

    def alternating(prompt, completion, answer):
        calls.append(prompt)
        return float(len(calls) % 2)

    recipe = tiny(tmp_path, sft_folder, "run", kl_beta=0.1, updates_per_step=2)
    recipe = dataclasses.replace(
        recipe, profile=ProfileConfig("2"), output=dataclasses.replace(recipe.output, tensorboard=True)
    )
    result = run_grpo(recipe, reward=alternating)
    assert result.steps_done == 2 and len(calls) == 2 * 2 * 3
    assert [row.weights_version for row in result.history] == [1, 2]
    assert result.weights_version == 2 and result.skipped_samples == 0
    _, saved = load_model(result.weights_path.parent)
    assert weights_checksum(trainer_state(saved)) == result.checksum == result.history[-1].checksum
    _, start = load_model(sft_folder)
    assert weights_checksum(trainer_state(start)) != result.checksum  # the update changed the weights
    first = result.history[0]
    assert first.kl is not None and first.kl >= 0 and 0 <= first.clip_fraction <= 1
    assert first.reward_mean == 0.5 and first.samples == 6 and first.loss is not None
    assert result.summary.losses == [row.loss for row in result.history]
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "reward_mean" in line] == [1, 2]
    assert result.before is not None and result.after is not None
    assert result.sampled_before is not None and result.sampled_after is not None
    record = json.loads((result.run_dir / "eval.json").read_text())
    assert record["after"]["sampled_accuracy"] == result.sampled_after and record["after"]["samples_per_prompt"] == 4
    assert (result.weights_path.parent / "tokenizer.json").is_file()
    assert (result.run_dir / "checkpoints" / "step-000002" / "trainer.json").is_file()
    [trace] = list((result.run_dir / "profile").glob("rank0.*.pt.trace.json"))  # profile.steps 2
    assert {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]} >= {"step 2"}
    board = EventAccumulator(str(result.run_dir / "tensorboard"))
    board.Reload()
    assert board.Scalars("hparams/final_loss")[0].value == pytest.approx(result.history[-1].loss)
    assert [event.step for event in board.Scalars("train/reward_mean")] == [1, 2]
    sampled = sum(line["completion_length"] * line["samples"] for line in lines if "reward_mean" in line)
    assert sampled > 0 and all(line["rollout_tokens_per_second"] > 0 for line in lines if "reward_mean" in line)
    assert all(row.update_tokens_per_second > 0 and row.update_seconds > 0 for row in result.history)
    assert all(row.rollout_seconds + row.update_seconds <= row.step_seconds for row in result.history)
    assert (result.run_dir / "rewards.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (result.run_dir / "loss.png").is_file()
    assert result.run_seconds is not None and result.run_seconds > result.summary.wall_seconds
    assert any(label == "wall time" and "(the steps" in value for label, value in result.summary_rows())


def test_engine_checksum_equals_trainer_after_each_step(tmp_path, sft_folder, monkeypatch):
    seen = []
    original = grpo_trainer.sync_engine

    def checked(model, engine, version):
        report = original(model, engine, version)
        seen.append((version, engine.weights_version, engine.checksum(), weights_checksum(trainer_state(model))))
        return report

    monkeypatch.setattr(grpo_trainer, "sync_engine", checked)
    run_grpo(tiny(tmp_path, sft_folder, "sync"), reward=lambda p, c, a: float(len(c) % 2))
    assert [(v, ev) for v, ev, _, _ in seen] == [(1, 1), (2, 2)]
    assert all(engine == trainer for _, _, engine, trainer in seen)


@pytest.mark.parametrize("engine_logprobs_follow_temperature", [True, False])
def test_the_trainer_recomputes_only_the_logprobs_an_engine_does_not_record_at_temperature(
    tmp_path, sft_folder, monkeypatch, engine_logprobs_follow_temperature
):
    calls = []

    def spy(batch, policy_logprobs):
        calls.append(batch.tokens_NL.shape)
        return with_policy_logprobs(batch, policy_logprobs)

    monkeypatch.setattr(grpo_trainer, "with_policy_logprobs", spy)
    monkeypatch.setattr(BuiltinEngine, "logprobs_follow_temperature", engine_logprobs_follow_temperature, raising=False)
    recipe = tiny(tmp_path, sft_folder, f"recompute{engine_logprobs_follow_temperature}", steps=2, temperature=0.7)
    result = run_grpo(recipe, reward=lambda p, c, a: float(len(c) % 3))
    assert len(result.history) == 2
    assert len(calls) == (0 if engine_logprobs_follow_temperature else 2)


def test_a_raising_reward_is_counted_as_skipped(tmp_path, sft_folder):
    calls = []

    def flaky(prompt, completion, answer):
        calls.append(1)
        if len(calls) % 3 == 0:
            raise RuntimeError("judge unavailable")
        return float(len(calls) % 2)

    result = run_grpo(tiny(tmp_path, sft_folder, "flaky", steps=1), reward=flaky)
    assert result.skipped_samples == 2  # samples 3 and 6 of 6
    row = result.history[0]
    assert row.skipped == 2 and len(row.reward_errors) == 2
    assert "RuntimeError: judge unavailable" in row.reward_errors[0]


def test_every_sample_of_a_prompt_skipped_drops_the_prompt(tmp_path, sft_folder):
    def broken(prompt, completion, answer):
        raise KeyError("no")

    result = run_grpo(tiny(tmp_path, sft_folder, "broken", steps=1), reward=broken)
    assert result.skipped_samples == 6 and result.history[0].loss is None and result.weights_version == 1
    _, start = load_model(sft_folder)
    assert weights_checksum(trainer_state(start)) == result.checksum  # nothing to train on: no update


def test_missing_or_wrong_init_from_says_to_run_sft_first(tmp_path):
    with pytest.raises(ValueError, match=r"model.init_from is not set.*sft_debug"):
        run_grpo(tiny(tmp_path, None, "none"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"not a titanpod model folder.*sft_debug"):
        run_grpo(tiny(tmp_path, empty, "empty"))


def test_a_prompt_longer_than_the_context_is_refused_before_any_work(tmp_path, sft_folder):
    with pytest.raises(ValueError, match=r"needs \d+ positions, more than the model's context of 48"):
        run_grpo(tiny(tmp_path, sft_folder, "long", max_new_tokens=40))
    assert not (tmp_path / "long").exists()


def test_prompts_that_do_not_split_into_micro_batches_are_refused_before_any_work(tmp_path, sft_folder):
    with pytest.raises(ValueError, match=r"6 sequences .* train.grad_accum_steps=4"):
        run_grpo(tiny(tmp_path, sft_folder, "split", train={"grad_accum_steps": 4}))
    assert not (tmp_path / "split").exists()


def test_a_single_controller_lane_is_refused_with_the_fix():
    class OneController:
        lane, single_controller = "xla", True

    with pytest.raises(ValueError, match=r"the xla lane drives every device .* --device.lane"):
        check_launch(grpo_debug(), OneController(), 1)


def test_a_lane_whose_sdpa_does_not_run_as_installed_is_refused_unless_attention_is_math(tmp_path, sft_folder,
                                                                                         monkeypatch):  # fmt: skip
    from titanpod.device.backends.cpu import CpuBackend
    from titanpod.kernels import KernelConfig

    problem = "on the tpu lane it runs torch_tpu's SDPA kernel, which libtpu 0.0.42 cannot compile"
    monkeypatch.setattr(CpuBackend, "sdpa_problem", classmethod(lambda cls: problem))
    refusal = r"decodes with PyTorch's SDPA .* libtpu 0.0.42 cannot compile.*attention math"
    with pytest.raises(ValueError, match=refusal):
        run_grpo(tiny(tmp_path, sft_folder, "old-libtpu"))
    assert not (tmp_path / "old-libtpu").exists()
    # Plain-op attention, in the updates and the engine's decoding, needs no SDPA kernel: the run trains.
    math = dataclasses.replace(tiny(tmp_path, sft_folder, "math"), kernels=KernelConfig(attention="math"))
    result = run_grpo(math, reward=lambda prompt, completion, answer: float(len(completion) % 2))
    assert result.steps_done == 2 and result.weights_version == 2


def test_a_head_loss_is_refused_for_grpo_which_reads_logits(tmp_path, sft_folder):
    from titanpod.kernels import KernelConfig

    recipe = dataclasses.replace(tiny(tmp_path, sft_folder, "pallas"), kernels=KernelConfig(head_loss="pallas"))
    with pytest.raises(ValueError, match=r"kernels.head_loss 'pallas' does not apply to GRPO"):
        run_grpo(recipe)
    assert not (tmp_path / "pallas").exists()


def test_math_attention_samples_and_trains_like_sdpa(tmp_path, sft_folder):
    # The same run with each attention: the same rollouts (the engine's logprobs to 1e-5) and losses (1e-4, fp32).
    from titanpod.kernels import KernelConfig

    reward = lambda prompt, completion, answer: float(len(completion) % 2)  # noqa: E731
    sdpa = run_grpo(tiny(tmp_path, sft_folder, "sdpa"), reward=reward)
    math_recipe = dataclasses.replace(tiny(tmp_path, sft_folder, "math-same"), kernels=KernelConfig(attention="math"))
    math = run_grpo(math_recipe, reward=reward)
    assert [row.reward_mean for row in math.history] == [row.reward_mean for row in sdpa.history]
    assert [row.loss for row in math.history] == pytest.approx([row.loss for row in sdpa.history], rel=1e-4, abs=1e-6)


def test_grpo_debug_is_registered_with_the_old_optimizer_settings():
    entry = POSTTRAIN_RECIPES["grpo_debug"]
    recipe = entry.build()
    assert entry.kind == "grpo" and recipe.model.init_from is None
    assert GRPORecipe.from_dict(recipe.to_dict()) == recipe
    train = recipe.train
    assert (train.steps, train.lr, train.warmup_steps, train.decay) == (20, 5e-4, 5, "constant")
    assert (train.weight_decay, train.beta2, train.grad_clip) == (0.0, 0.99, 1.0)
    assert recipe.checkpoint.export_hf


def test_group_of_equal_rewards_gives_no_update(tmp_path, sft_folder):
    result = run_grpo(tiny(tmp_path, sft_folder, "flat", steps=1), reward=lambda p, c, a: 1.0)
    row = result.history[0]
    assert row.zero_signal_groups == 2 and row.accuracy == 1.0
    _, start = load_model(sft_folder)
    _, end = load_model(result.weights_path.parent)
    for (name, a), (_, b) in zip(start.state_dict().items(), end.state_dict().items(), strict=True):
        assert torch.equal(a, b), name  # zero advantages: zero gradient, AdamW without weight decay leaves them


def test_a_run_whose_every_group_stays_flat_says_so_and_what_to_try(tmp_path, sft_folder):
    console = Console(record=True, width=400)
    run_grpo(tiny(tmp_path, sft_folder, "stalled", steps=3), console=console, reward=lambda p, c, a: 1.0)
    said = console.export_text()
    assert "step 3: every group of the last 3 steps earned one reward per group (no learning signal" in said
    assert "the task is solved for this policy" in said


def test_the_learning_rate_follows_the_graph_schedule(tmp_path, sft_folder):
    recipe = tiny(tmp_path, sft_folder, "warmup", steps=3, train={"lr": 1e-3, "warmup_steps": 2})
    result = run_grpo(recipe, reward=lambda p, c, a: float(len(c) % 2))
    assert [row.lr for row in result.history] == pytest.approx([5e-4, 1e-3, 1e-3])


def lowercase_share(prompt, completion, answer):
    """A dense reward a random model can learn in a few steps: the share of lowercase letters."""
    return sum(char.islower() for char in completion) / max(len(completion), 1)


def test_the_reward_rises_over_a_short_run(tmp_path, sft_folder):
    recipe = tiny(tmp_path, sft_folder, "learn", steps=16, group_size=8, prompts_per_step=4, temperature=1.0)
    recipe = dataclasses.replace(recipe, eval=dataclasses.replace(recipe.eval, enabled=False))
    result = run_grpo(recipe, reward=lowercase_share)
    rewards = [row.reward_mean for row in result.history]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.3, rewards


def test_the_captured_whole_step_trains_like_eager(tmp_path, sft_folder):
    def reward(p, c, a):
        return float(len(c) % 2)

    eager = run_grpo(tiny(tmp_path, sft_folder, "eager", steps=3, kl_beta=0.1, updates_per_step=2), reward=reward)
    other = tiny(tmp_path, sft_folder, "whole", steps=3, kl_beta=0.1, updates_per_step=2,
                 train={"step_mode": "whole_step", "compiler": "none"})  # fmt: skip
    captured = run_grpo(other, reward=reward)
    torch.testing.assert_close(captured.summary.losses, eager.summary.losses, rtol=1e-5, atol=1e-6)
    assert [r.reward_mean for r in captured.history] == [r.reward_mean for r in eager.history]


def test_a_run_stopped_at_step_2_resumes_to_the_same_losses(tmp_path, sft_folder):
    def reward(p, c, a):
        return lowercase_share(p, c, a)

    def recipe(name, **train):
        return tiny(tmp_path, sft_folder, name, steps=4, kl_beta=0.1, updates_per_step=2, train=train)

    straight = run_grpo(recipe("straight"), reward=reward)
    first = run_grpo(recipe("split", stop_at_step=2), reward=reward)
    assert first.steps_done == 2 and (tmp_path / "split" / "checkpoints" / "step-000002").is_dir()
    second = run_grpo(recipe("split"), reward=reward)
    assert second.summary.start_step == 2 and second.steps_done == 4
    assert [r.step for r in second.history] == [3, 4]
    assert first.summary.losses + second.summary.losses == straight.summary.losses  # bit for bit
    assert second.checksum == straight.checksum
    # The resumed process keeps the scores of the run's start rather than scoring its step-2 weights as the start.
    assert second.before == straight.before and second.sampled_before == straight.sampled_before
    split, whole = (json.loads((tmp_path / name / "eval.json").read_text()) for name in ("split", "straight"))
    assert split["before"] == whole["before"] and split["after"] == whole["after"]


def test_grpo_config_names_a_reward_path_without_a_colon_and_held_out_rows_without_a_task_file():
    with pytest.raises(ValueError, match=r"reward_function 'rewards.score' is not an import path: write module"):
        GRPOConfig(reward_function="rewards.score")
    with pytest.raises(ValueError, match=r"eval_path holds held-out rows of a data_path task: set data_path too"):
        GRPOConfig(eval_path="held_out.jsonl")
    assert GRPOConfig(data_path="rows.jsonl", eval_path="held_out.jsonl", reward_function="rewards:score")


def test_rollout_config_names_bad_settings():
    with pytest.raises(ValueError, match=r"--rollout\.mode ray for several workers"):
        RolloutConfig(mode="local", workers=2)
    with pytest.raises(ValueError, match=r"rollout\.mode"):
        RolloutConfig(mode="threads")
    with pytest.raises(ValueError, match="workers must be >= 1"):
        RolloutConfig(mode="ray", workers=0)


def test_ray_mode_without_ray_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(ImportError, match=r"titanpod-posttrain\[ray\]"):
        import_ray()


def test_sampled_accuracy_counts_exact_answers_among_the_engines_samples():
    tokenizer = load_sft_tokenizer("chars")
    task = get_task("reverse")
    examples = [Example("reverse: abc\n", "cba"), Example("reverse: xy\n", "yx")]
    texts = ["cba", "cbb", "yx", "yx<|endoftext|>"]  # 3 of the 4 samples are exact answers

    class ScriptedEngine:
        def generate(self, prompts, params):
            assert params.n == 2 and len(prompts) == 2 and params.temperature == 0.7
            return [
                Completion(i // 2, prompts[i // 2], tokenizer.encode(text), torch.zeros(1), "stop", i % 2)
                for i, text in enumerate(texts)
            ]

    recipe = dataclasses.replace(grpo_debug(), grpo=GRPOConfig(eval_samples=2, temperature=0.7))
    assert sampled_accuracy(ScriptedEngine(), tokenizer, task, examples, recipe) == 0.75


def test_the_reward_curves_follow_the_weights_through_a_resume(tmp_path):
    from titanpod.rl.grpo.reward_plot import draw_reward_plot, step_rows

    def row(step: int, reward: float) -> str:
        return json.dumps({"step": step, "reward_mean": reward, "accuracy": reward / 2}) + "\n"

    # Steps 1-3 ran, the run went back to its checkpoint at step 2 and ran 3 and 4 again.
    lines = [row(1, 0.1), row(2, 0.2), row(3, 0.9), json.dumps({"step": 3, "eval_accuracy": 0.5}) + "\n"]
    (tmp_path / "metrics.jsonl").write_text("".join([*lines, row(3, 0.3), row(4, 0.4), '{"step": 5, "rew']))
    assert [(r["step"], r["reward_mean"]) for r in step_rows(tmp_path / "metrics.jsonl")] == [
        (1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)
    ]  # fmt: skip
    (tmp_path / "eval.json").write_text(json.dumps({"before": {"step": 0, "accuracy": 0.1}}))
    assert draw_reward_plot(tmp_path, "run").read_bytes()[:4] == b"\x89PNG"
    assert draw_reward_plot(tmp_path / "empty", "run") is None
