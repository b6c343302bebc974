"""The KV cache: decoding with it gives the full forward's logits, for every decoder family.

Prompts of different lengths share one batch right-padded; each row keeps its own length.
"""

import pytest
import torch

from titanpod.models import Transformer
from titanpod.models.common.kv_cache import KVCache, cached_causal_mask
from titanpod.recipes.families import build_model

FAMILIES = ["llama3", "qwen3", "qwen3_moe"]
TOLERANCE = 1e-5


def debug_model(family: str, seed: int = 0) -> Transformer:
    model = build_model(family, "debug")
    model.to_empty(device="cpu")
    model.init_weights(seed)
    return model.eval()


def random_prompts(lengths: list[int], vocab_size: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def right_padded(prompts: list[list[int]], pad: int = 0) -> torch.Tensor:
    width = max(len(p) for p in prompts)
    return torch.tensor([p + [pad] * (width - len(p)) for p in prompts])


@torch.no_grad()
def greedy_with_cache(model: Transformer, prompts: list[list[int]], steps: int, pad: int = 0):
    """Greedy decoding with the cache: each row's logits at every step, and its tokens."""
    lengths = torch.tensor([len(p) for p in prompts])
    cache = KVCache.for_model(model, len(prompts), int(lengths.max()) + steps)
    logits_BSV = model.forward_with_cache(right_padded(prompts, pad), cache, start_position=0)
    cache.set_lengths(lengths)
    logits_BV = logits_BSV[torch.arange(len(prompts)), lengths - 1]
    all_logits, tokens = [], []
    for _ in range(steps):
        all_logits.append(logits_BV)
        next_B = logits_BV.argmax(-1)
        tokens.append(next_B)
        logits_BV = model.forward_with_cache(next_B[:, None], cache)[:, 0]
    return torch.stack(all_logits, 1), torch.stack(tokens, 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decoding_with_the_cache_matches_full_forwards_step_by_step(family):
    model = debug_model(family)
    prompts = random_prompts([5, 11, 1, 8], model.args.vocab_size)
    steps = 10
    cached_logits, tokens = greedy_with_cache(model, prompts, steps)
    worst = 0.0
    with torch.no_grad():
        for b, prompt in enumerate(prompts):
            sequence = torch.tensor(prompt + tokens[b].tolist())[None]
            full_logits = model(sequence)[0, len(prompt) - 1 : len(prompt) - 1 + steps]
            worst = max(worst, (full_logits - cached_logits[b]).abs().max().item())
            assert torch.equal(full_logits.argmax(-1), tokens[b])
    assert worst <= TOLERANCE, f"{family}: max |cached - full| = {worst:.3g}"


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_of_a_whole_batch_equals_forward(family):
    model = debug_model(family)
    tokens = torch.tensor(random_prompts([12, 12], model.args.vocab_size))
    with torch.no_grad():
        cache = KVCache.for_model(model, 2, 16)
        cached = model.forward_with_cache(tokens, cache, 0)
        torch.testing.assert_close(cached, model(tokens), atol=TOLERANCE, rtol=0)
    assert cache.lengths_B.tolist() == [12, 12]


def test_padding_is_never_attended_to():
    model = debug_model("qwen3")
    prompts = random_prompts([3, 9], model.args.vocab_size)
    logits_a, tokens_a = greedy_with_cache(model, prompts, 4, pad=0)
    logits_b, tokens_b = greedy_with_cache(model, prompts, 4, pad=77)
    assert torch.equal(tokens_a, tokens_b)
    torch.testing.assert_close(logits_a, logits_b, atol=1e-6, rtol=0)


def test_chunks_and_per_row_starts_continue_each_row():
    model = debug_model("llama3")
    tokens = torch.tensor(random_prompts([10, 10], model.args.vocab_size, seed=3))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache.for_model(model, 2, 10)
        model.forward_with_cache(tokens[:, :4], cache, 0)
        chunk = model.forward_with_cache(tokens[:, 4:7], cache)  # continues from lengths_B = 4
        torch.testing.assert_close(chunk, full[:, 4:7], atol=TOLERANCE, rtol=0)
        # Rewind row 1 and feed it again from position 4 with a per-row start tensor.
        rows = model.forward_with_cache(tokens[:, 4:7], cache, torch.tensor([4, 4]))
        torch.testing.assert_close(rows, full[:, 4:7], atol=TOLERANCE, rtol=0)


def test_causal_mask_by_absolute_position():
    mask = cached_causal_mask(torch.tensor([[2], [0]]), 4)
    assert mask.shape == (2, 1, 1, 4)
    assert mask[0, 0, 0].tolist() == [True, True, True, False]
    assert mask[1, 0, 0].tolist() == [True, False, False, False]


def test_cache_errors_name_the_problem():
    model = debug_model("llama3")
    cache = KVCache.for_model(model, 2, 8)
    with pytest.raises(ValueError, match="do not fit a cache of 8 positions"):
        model.forward_with_cache(torch.zeros(2, 9, dtype=torch.long), cache, 0)
    with pytest.raises(ValueError, match="holds 2 rows"):
        model.forward_with_cache(torch.zeros(3, 1, dtype=torch.long), cache, 0)
    with pytest.raises(ValueError, match=r"lie in \[0, 8\]"):
        cache.set_lengths([3, 9])


def test_cache_shape_dtype_and_device_follow_the_model():
    model = debug_model("qwen3").to(torch.bfloat16)
    cache = KVCache.for_model(model, 3, 20)
    args = model.args
    assert cache.keys[0].shape == (3, args.n_kv_heads, 20, args.resolved_head_dim)
    assert cache.keys[0].dtype == torch.bfloat16 and len(cache.values) == args.n_layers
    assert (cache.batch_size, cache.max_seq_len, cache.n_layers) == (3, 20, args.n_layers)
