"""GRPO at a sampling temperature other than 1 optimises the policy that sampled: the engine records, and the
objective computes, logprobs of softmax(logits / temperature), so the first update's ratio is 1 and its
gradient is the policy gradient of the sampled distribution."""

from __future__ import annotations

import dataclasses

import torch

from titanpod.models import DecoderArgs
from titanpod.recipes.families import build_model
from titanpod.rl.grpo.batches import build_batch, token_weight, with_policy_logprobs
from titanpod.rl.grpo.objective import ADVANTAGE, OLD_LOGPROB, WEIGHT, GRPOObjective, token_logprobs
from titanpod.rl.grpo.rewards import score_rollouts
from titanpod.rl.rollout import BuiltinEngine, SamplingParams
from titanpod.rl.rollout.vllm_engine import VLLMEngine

TINY = DecoderArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=64, max_seq_len=32)
TEMPERATURE = 0.7
LENGTH = 16
PAD = 0


def policy():
    model = build_model("llama3", TINY)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    # Sharper logits than at initialisation, so temperature 0.7 and 1 give clearly different logprobs.
    with torch.no_grad():
        model.output.weight.mul_(20.0)
    return model


def sampled(model, top_p: float):
    engine = BuiltinEngine(model)
    prompts = [[5, 9, 2], [7, 1, 3, 8, 4]]
    params = SamplingParams(max_new_tokens=6, temperature=TEMPERATURE, top_p=top_p, stop_token_ids=[], seed=3, n=4)
    return engine.generate(prompts, params)


def sampled_policy_logprobs(model, completion) -> torch.Tensor:
    """Each completion token's logprob under softmax(logits / TEMPERATURE), from one plain forward."""
    tokens = torch.tensor([completion.prompt_ids + completion.token_ids])
    start = len(completion.prompt_ids)
    logits = model(tokens)[0, start - 1 : -1].float() / TEMPERATURE
    return logits.log_softmax(-1).gather(-1, tokens[0, start:, None])[:, 0]


def scored(completions):
    def reward(prompt, text, answer):
        return float(len(set(text)))

    texts = ["".join(chr(97 + t % 26) for t in c.token_ids) for c in completions]
    examples = [dataclasses.make_dataclass("E", ["prompt", "answer"])(f"p{i}", "") for i in range(2)]
    return score_rollouts(examples, completions, texts, reward)


def test_the_engine_records_logprobs_of_the_distribution_it_samples_from():
    model = policy()
    for top_p in (1.0, 0.9):
        for completion in sampled(model, top_p):
            with torch.no_grad():
                want = sampled_policy_logprobs(model, completion)
            torch.testing.assert_close(completion.logprobs, want, rtol=0, atol=2e-5)


def test_the_first_update_has_ratio_one_and_the_sampled_policys_gradient():
    model = policy()
    completions = sampled(model, top_p=0.9)
    rollout = scored(completions)
    assert any(a != 0 for a in rollout.advantages)  # the update has a signal to follow
    batch = build_batch(rollout, LENGTH, PAD, token_weight(rollout.completion_tokens, 1, 1))
    objective = GRPOObjective(model, clip_eps=0.2, kl_beta=0.0, temperature=TEMPERATURE)

    # The ratio exp(new - old) is 1 on every completion token before any update.
    with torch.no_grad():
        new_NL = token_logprobs(model, batch.tokens_NL, temperature=TEMPERATURE)
    mask_NL = batch.targets_NLF[..., WEIGHT] > 0
    ratio = torch.exp(new_NL - batch.targets_NLF[..., OLD_LOGPROB])[mask_NL]
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=5e-5)

    # With ratio 1 the surrogate's gradient is -sum(weight x advantage x grad log pi_T(token)).
    loss, _ = objective.loss_and_metrics(batch.tokens_NL, batch.targets_NLF)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    likelihood = torch.zeros(())
    for row, completion in enumerate(completions):
        start = len(completion.prompt_ids)
        stop = start + len(completion.token_ids)
        weight = batch.targets_NLF[row, start:stop, WEIGHT]
        advantage = batch.targets_NLF[row, start:stop, ADVANTAGE]
        likelihood = likelihood - (weight * advantage * sampled_policy_logprobs(model, completion)).sum()
    want_grads = torch.autograd.grad(likelihood, list(model.parameters()))
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_logprobs_recorded_at_temperature_one_are_recomputed_at_the_sampling_temperature():
    model = policy()
    # What an engine recording raw (temperature 1) logprobs, as vLLM does, would have sent.
    raw = []
    for completion in sampled(model, top_p=0.9):
        tokens = torch.tensor([completion.prompt_ids + completion.token_ids])
        start = len(completion.prompt_ids)
        with torch.no_grad():
            logits = model(tokens)[0, start - 1 : -1].float()
        logprobs = logits.log_softmax(-1).gather(-1, tokens[0, start:, None])[:, 0]
        raw.append(dataclasses.replace(completion, logprobs=logprobs))
    rollout = scored(raw)
    batch = build_batch(rollout, LENGTH, PAD, token_weight(rollout.completion_tokens, 1, 1))
    fixed = with_policy_logprobs(batch, lambda tokens_NL: token_logprobs(model, tokens_NL, TEMPERATURE))
    mask_NL = batch.targets_NLF[..., WEIGHT] > 0
    for row, completion in enumerate(raw):
        start = len(completion.prompt_ids)
        with torch.no_grad():
            want = sampled_policy_logprobs(model, completion)
        got = fixed.targets_NLF[row, start : start + len(completion.token_ids), OLD_LOGPROB]
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    recorded, recomputed = batch.targets_NLF[..., OLD_LOGPROB], fixed.targets_NLF[..., OLD_LOGPROB]
    assert not torch.allclose(recorded[mask_NL], recomputed[mask_NL])  # temperature 1 and 0.7 differ here
    others = [field for field in range(batch.targets_NLF.shape[-1]) if field != OLD_LOGPROB]
    assert torch.equal(fixed.targets_NLF[..., others], batch.targets_NLF[..., others])
    assert torch.equal(fixed.targets_NLF[~mask_NL], batch.targets_NLF[~mask_NL])
    assert VLLMEngine.logprobs_follow_temperature is False
    assert getattr(BuiltinEngine(model), "logprobs_follow_temperature", True)
