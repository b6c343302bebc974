"""The built-in rollout engine: greedy and seeded sampling against full forwards, stops, groups, errors."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from titanpod.models import DecoderArgs, MoEArgs, Transformer
from titanpod.recipes.families import build_model
from titanpod.rl.rollout import BuiltinEngine, Completion, RolloutEngine, SamplingParams

TINY = DecoderArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, ffn_dim=96, max_seq_len=48)
TINY_QWEN_MOE = dataclasses.replace(
    TINY, qk_norm=True, head_dim=16, tie_embeddings=True, moe=MoEArgs(n_experts=4, top_k=2, expert_ffn_dim=32)
)
PROMPTS = [[1, 2, 3], [9, 8, 7, 6, 5, 4, 3], [42]]


def tiny_model(args: DecoderArgs = TINY, seed: int = 0) -> Transformer:
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    model.init_weights(seed)
    return model


@torch.no_grad()
def greedy_by_hand(model: Transformer, prompt: list[int], steps: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(steps):
        tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    return tokens[len(prompt) :]


@torch.no_grad()
def full_forward_logprobs(model: Transformer, completion: Completion, temperature: float = 1.0) -> torch.Tensor:
    sequence = torch.tensor([completion.prompt_ids + completion.token_ids])
    start = len(completion.prompt_ids) - 1
    logprobs = F.log_softmax(model(sequence)[0].float() / temperature, dim=-1)
    logprobs = logprobs[start : start + len(completion.token_ids)]
    return logprobs.gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]


@pytest.mark.parametrize("family", ["llama3", "qwen3", "qwen3_moe"])
def test_greedy_equals_argmax_decoding_by_hand(family):
    model = build_model(family, "debug")
    model.to_empty(device="cpu")
    model.init_weights(1)
    engine = BuiltinEngine(model, max_batch=8)
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.0))
    for completion, prompt in zip(completions, PROMPTS, strict=True):
        assert completion.token_ids == greedy_by_hand(model, prompt, 6)
        assert completion.finish_reason == "length" and completion.prompt_ids == prompt
        torch.testing.assert_close(completion.logprobs, full_forward_logprobs(model, completion), atol=1e-5, rtol=0)


def test_engine_satisfies_the_protocol():
    assert isinstance(BuiltinEngine(tiny_model()), RolloutEngine)


@pytest.mark.parametrize("args", [TINY, TINY_QWEN_MOE], ids=["llama", "qwen_moe"])
def test_seeded_sampling_is_reproducible_and_depends_on_the_seed(args):
    engine = BuiltinEngine(tiny_model(args), max_batch=4)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7, n=2)
    first = engine.generate(PROMPTS, params)
    again = engine.generate(PROMPTS, params)
    other = engine.generate(PROMPTS, dataclasses.replace(params, seed=8))
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert all(torch.equal(a.logprobs, b.logprobs) for a, b in zip(first, again, strict=True))
    assert [c.token_ids for c in first] != [c.token_ids for c in other]


def test_completions_do_not_depend_on_batching():
    model = tiny_model()
    params = SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.95, seed=3, n=3)
    one_by_one = BuiltinEngine(model, max_batch=1).generate(PROMPTS, params)
    together = BuiltinEngine(model, max_batch=16).generate(PROMPTS, params)
    assert [c.token_ids for c in one_by_one] == [c.token_ids for c in together]
    for a, b in zip(one_by_one, together, strict=True):
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def test_sampling_does_not_touch_the_global_rng():
    engine = BuiltinEngine(tiny_model())
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=1.0))
    assert torch.equal(torch.rand(3), expected)


def test_tiny_top_p_is_greedy():
    engine = BuiltinEngine(tiny_model())
    greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.0))
    nucleus = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=5, n=2))
    for index, completion in enumerate(nucleus):
        assert completion.token_ids == greedy[index // 2].token_ids


def test_stop_tokens_end_a_completion_with_reason_stop():
    model = tiny_model()
    engine = BuiltinEngine(model)
    free = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.0))
    stop = free[1].token_ids[2]  # prompt 1's third greedy token
    stopped = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(stop,)))
    first_hit = free[1].token_ids.index(stop)
    assert stopped[1].token_ids == free[1].token_ids[: first_hit + 1]
    assert stopped[1].finish_reason == "stop" and len(stopped[1].logprobs) == first_hit + 1
    for completion, unstopped in zip(stopped, free, strict=True):
        if stop not in unstopped.token_ids:
            assert completion.finish_reason == "length" and completion.token_ids == unstopped.token_ids


def test_n_completions_per_prompt_are_grouped_by_prompt():
    engine = BuiltinEngine(tiny_model(), max_batch=4)
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=5, temperature=1.0, n=4))
    assert len(completions) == len(PROMPTS) * 4
    assert [c.prompt_index for c in completions] == [0] * 4 + [1] * 4 + [2] * 4
    assert [c.sample_index for c in completions] == [0, 1, 2, 3] * 3
    assert all(c.prompt_ids == PROMPTS[c.prompt_index] for c in completions)
    assert len({tuple(c.token_ids) for c in completions[:4]}) > 1  # a group holds different samples


@pytest.mark.parametrize("args", [TINY, TINY_QWEN_MOE], ids=["llama", "qwen_moe"])
def test_logprobs_equal_full_forward_log_softmax_at_the_temperature_at_the_sampled_tokens(args):
    model = tiny_model(args)
    engine = BuiltinEngine(model, max_batch=3)
    params = SamplingParams(max_new_tokens=10, temperature=1.3, top_p=0.9, seed=11, n=2)
    for completion in engine.generate(PROMPTS, params):
        assert completion.logprobs.dtype == torch.float32
        assert completion.logprobs.shape == (len(completion.token_ids),)
        want = full_forward_logprobs(model, completion, temperature=1.3)
        torch.testing.assert_close(completion.logprobs, want, atol=1e-5, rtol=0)


def test_prompt_errors_name_the_prompt_and_lengths():
    engine = BuiltinEngine(tiny_model(), max_seq_len=32)
    params = SamplingParams(max_new_tokens=10)
    with pytest.raises(ValueError, match=r"Prompt 1 has 23 tokens.*max_new_tokens=10.*32 - 10 = 22"):
        engine.generate([[1], [1] * 23], params)
    with pytest.raises(ValueError, match=r"Prompt 0 has 49 tokens, more than the model's max context of 48"):
        BuiltinEngine(tiny_model()).generate([[1] * 49], params)
    with pytest.raises(ValueError, match="no prompts"):
        engine.generate([], params)
    with pytest.raises(ValueError, match="Prompt 2 is empty"):
        engine.generate([[1], [2], []], params)
    with pytest.raises(ValueError, match=r"Prompt 0 holds token ids outside the vocabulary \[0, 128\): \[128\]"):
        engine.generate([[1, 128]], params)
    engine.generate([[1] * 22], params)  # exactly fits


def test_sampling_params_are_checked():
    with pytest.raises(ValueError, match="top_p must lie in"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match=r"temperature must be >= 0.*n \(completions per prompt\) must be >= 1"):
        SamplingParams(temperature=-1, n=0)
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)  # type: ignore[arg-type]
