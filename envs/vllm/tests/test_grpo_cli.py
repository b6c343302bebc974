"""``titanpod-posttrain --recipe grpo_debug --rollout.mode vllm`` as a user runs it: rollouts from vLLM's CPU build,
the trainer's weights pushed into it after every step."""

from __future__ import annotations

import json

import pytest
from conftest import TINY, run_python

STEPS = 3
REWARD = """
def distinct_characters(prompt, completion, row):
    return len(set(completion)) / 4
"""
"""A reward a random model's completions earn unevenly (the arithmetic answer almost never comes), so every
group carries a learning signal and every step moves the weights."""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A short GRPO run from a tiny random Llama saved as an SFT run leaves its model; its directory and output."""
    from titanpod.checkpoint import save_model
    from titanpod.data.sft.tokenizer import load_sft_tokenizer
    from titanpod.recipes.families import build_model

    where = tmp_path_factory.mktemp("grpo_vllm")
    model = build_model("llama3", TINY)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    save_model(model, "llama3", where / "model", {"step": 0}, extra_files=load_sft_tokenizer("chars").files())
    (where / "uneven.py").write_text(REWARD, encoding="utf-8")
    done = run_python(
        "-m", "titanpod.posttrain.cli", "--recipe", "grpo_debug", "--model.init-from", "model",
        "--train.steps", str(STEPS), "--train.warmup-steps", "1", "--train.log-every", "1",
        "--grpo.prompts-per-step", "2", "--grpo.group-size", "3", "--grpo.max-new-tokens", "4",
        "--eval.examples", "4", "--eval.max-new-tokens", "4", "--grpo.eval-samples", "0",
        "--grpo.reward-function", "uneven:distinct_characters",
        "--device.lane", "cpu", "--checkpoint.export-hf", "False", "--output.run-name", "vllm",
        "--rollout.mode", "vllm", "--rollout.vllm-dtype", "float32", "--rollout.vllm-enforce-eager", "True",
        "--rollout.vllm-kv-cache-mib", "16",
        cwd=where,
    )  # fmt: skip
    return where / "runs" / "vllm", done


def test_the_run_samples_from_vllm_and_pushes_every_step(run):
    run_dir, done = run
    assert "vLLM 0.32.0 (float32 weights" in done.stdout, done.stdout[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in steps if "reward_mean" in row]
    assert [row["weights_version"] for row in steps] == list(range(1, STEPS + 1))
    assert all(row["samples"] == 2 * 3 and row["grad_norm"] > 0 for row in steps), steps
    assert len({row["checksum"] for row in steps}) == STEPS  # each step pushed new weights, verified in the worker
    assert len({row["sync_bytes"] for row in steps}) == 1 and steps[0]["sync_bytes"] > 0


def test_the_run_writes_its_model_and_held_out_scores(run):
    run_dir, _ = run
    assert (run_dir / "model").is_dir()
    evaluation = json.loads((run_dir / "eval.json").read_text())
    assert evaluation["before"]["step"] == 0 and evaluation["after"]["step"] == STEPS
