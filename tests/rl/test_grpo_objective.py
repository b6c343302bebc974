"""The GRPO objective run by the graph's training step: its loss equals the pure loss functions on each
completion's own forward, and every step mode and micro-batch split trains it alike."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from titanpod.device import get_backend
from titanpod.graph import TrainConfig, build_step
from titanpod.models import DecoderArgs
from titanpod.recipes.families import build_model
from titanpod.rl.grpo.batches import build_batch, token_weight
from titanpod.rl.grpo.loss import clipped_policy_loss, kl_penalty
from titanpod.rl.grpo.objective import CLIP_FRACTION, KL, GRPOObjective, token_logprobs
from titanpod.rl.grpo.rewards import score_rollouts
from titanpod.rl.rollout import Completion

TINY = DecoderArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=64, max_seq_len=32)
PAD = 0


def policy(seed: int = 0):
    model = build_model("llama3", TINY)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model


def rollouts(seed: int = 1) -> list[Completion]:
    """Two prompts x three completions of different lengths, with made-up sampling logprobs."""
    generator = torch.Generator().manual_seed(seed)
    completions = []
    for prompt_index, prompt_length in enumerate((3, 5)):
        prompt = torch.randint(1, 64, (prompt_length,), generator=generator).tolist()
        for sample, length in enumerate((2, 4, 1)):
            tokens = torch.randint(1, 64, (length,), generator=generator).tolist()
            logprobs = -torch.rand(length, generator=generator) * 3
            completions.append(Completion(prompt_index, prompt, tokens, logprobs, "length", sample))
    return completions


def reward(prompt, text, answer):
    return float(len(text) % 3)


def scored(completions):
    texts = ["x" * len(c.token_ids) for c in completions]
    examples = [dataclasses.make_dataclass("E", ["prompt", "answer"])(f"p{i}", "") for i in range(2)]
    return score_rollouts(examples, completions, texts, reward)


def reference_loss(model, reference, completions, advantages, clip_eps, kl_beta):
    """The loss from each completion's own unpadded forward and the pure functions, as in one [N, T] batch."""
    T = max(len(c.token_ids) for c in completions)
    new_rows, ref_rows = [], []
    for completion in completions:
        tokens = torch.tensor([completion.prompt_ids + completion.token_ids])
        start = len(completion.prompt_ids)
        for net, rows in ((model, new_rows), (reference, ref_rows)):
            logits = net(tokens)[0, start - 1 : -1].float()
            logprobs = logits.log_softmax(-1).gather(-1, tokens[0, start:, None])[:, 0]
            rows.append(torch.nn.functional.pad(logprobs, (0, T - len(logprobs))))
    new_NT, ref_NT = torch.stack(new_rows), torch.stack(ref_rows).detach()
    old_NT = torch.stack([torch.nn.functional.pad(c.logprobs, (0, T - len(c.token_ids))) for c in completions])
    mask_NT = torch.arange(T)[None, :] < torch.tensor([len(c.token_ids) for c in completions])[:, None]
    loss, clip_fraction = clipped_policy_loss(new_NT, old_NT, torch.tensor(advantages), mask_NT, clip_eps)
    kl = kl_penalty(new_NT, ref_NT, mask_NT)
    return loss + kl_beta * kl, clip_fraction, kl


def test_the_objective_equals_the_pure_loss_on_each_completions_own_forward():
    model, reference = policy(0), policy(3)
    completions = rollouts()
    rollout = scored(completions)
    weight = token_weight(rollout.completion_tokens, 1, 1)
    batch = build_batch(rollout, 12, PAD, weight, lambda tokens: token_logprobs(reference, tokens))
    objective = GRPOObjective(model, clip_eps=0.05, kl_beta=0.3)
    loss, metrics = objective.loss_and_metrics(batch.tokens_NL, batch.targets_NLF)
    want, clip_fraction, kl = reference_loss(model, reference, completions, rollout.advantages, 0.05, 0.3)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(metrics[CLIP_FRACTION], clip_fraction, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(metrics[KL], kl, rtol=1e-5, atol=1e-6)
    assert 0 < metrics[CLIP_FRACTION] < 1 and metrics[KL] > 0  # the made-up old logprobs clip some tokens
    grads = torch.autograd.grad(loss, list(model.parameters()))
    want_grads = torch.autograd.grad(want, list(model.parameters()))
    for got, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_a_sample_whose_reward_failed_weighs_nothing():
    completions = rollouts()
    rollout = scored(completions)
    failed = dataclasses.replace(rollout, rewards=[None, *rollout.rewards[1:]])
    batch = build_batch(failed, 12, PAD, 1.0)
    assert batch.targets_NLF[0].abs().sum() == 0 and batch.targets_NLF[1].abs().sum() > 0
    assert failed.completion_tokens == rollout.completion_tokens - len(completions[0].token_ids)


def train_losses(step_mode: str, micro_batches: int, updates: int = 3) -> list[float]:
    torch.manual_seed(0)
    objective = GRPOObjective(policy(0), clip_eps=0.2, kl_beta=0.1)
    reference = policy(0)
    rollout = scored(rollouts())
    weight = token_weight(rollout.completion_tokens, micro_batches, 1)
    batch = build_batch(rollout, 12, PAD, weight, lambda tokens: token_logprobs(reference, tokens))
    config = TrainConfig(steps=10, lr=1e-2, warmup_steps=0, step_mode=step_mode, compiler="none")
    step = build_step(objective, config, get_backend("cpu"))
    losses = []
    for _ in range(updates):
        out = step(batch.micro_batches(micro_batches), 1e-2)
        assert bool(out.applied)
        losses.append(float(out.loss))
    return losses


@pytest.mark.parametrize(("step_mode", "micro_batches"), [("whole_step", 1), ("eager", 2), ("whole_step", 3)])
def test_every_step_mode_and_micro_batch_split_trains_alike(step_mode, micro_batches):
    want = train_losses("eager", 1)
    assert want[2] != want[0]  # the updates change the policy
    torch.testing.assert_close(train_losses(step_mode, micro_batches), want, rtol=1e-5, atol=1e-6)


def test_a_batch_of_the_wrong_shape_is_named():
    objective = GRPOObjective(policy(0), clip_eps=0.2, kl_beta=0.0)
    with pytest.raises(ValueError, match=r"needs \[2, 8, 4\].*GRPOBatch"):
        objective.loss(torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 8, 3))
