"""``kernels.attention math`` (scores, mask and softmax in plain PyTorch ops) equals SDPA forward and backward:
causal, local and within packed documents, with grouped query heads. Tolerances: fp32 1e-5; bf16 2e-2 (both sides
round their bf16 inputs and outputs, in different orders)."""

from __future__ import annotations

import pytest
import torch

from titanpod.kernels import KernelConfig, model_ops
from titanpod.kernels.math_attention import MathAttention
from titanpod.kernels.splash import local_causal_sdpa
from titanpod.models import sdpa_attention

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def heads(dtype: torch.dtype, B: int = 2, H: int = 4, K: int = 2, S: int = 24, D: int = 16):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(B, n, S, D, generator=generator).to(dtype).requires_grad_() for n in (H, K, K)]


def values_and_grads(attention, q, k, v, document_ids=None):
    out = attention(q, k, v, document_ids)
    grads = torch.autograd.grad((out.float() * torch.linspace(-1, 1, out.shape[-1])).sum(), (q, k, v))
    return [out, *grads]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("documents", [False, True])
def test_math_attention_equals_sdpa_forward_and_backward(dtype, window, documents):
    q, k, v = heads(dtype)
    document_ids = torch.tensor([[0] * 10 + [1] * 14, [3] * 7 + [4] * 9 + [8] * 8]) if documents else None
    reference = sdpa_attention if window is None else local_causal_sdpa(window)
    expected = values_and_grads(reference, q, k, v, document_ids)
    got = values_and_grads(MathAttention(window), q, k, v, document_ids)
    for name, want, have in zip(("out", "dq", "dk", "dv"), expected, got, strict=True):
        assert have.dtype == want.dtype, name
        torch.testing.assert_close(have.float(), want.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype], msg=name)


def test_the_config_chooses_it_with_the_recipes_window():
    assert model_ops(KernelConfig(attention="math", window=7)).attention == MathAttention(7)
    assert model_ops(KernelConfig(attention="math")).attention == MathAttention(None)


@pytest.mark.parametrize("window", [None, 5])
def test_math_attention_over_a_cache_equals_its_own_attention_over_the_whole_row(window):
    # New queries at positions 20..23 over a cache of 24 (T) keys: the same values as the rows' last 4 queries of
    # attention over the whole sequence (fp32, 1e-5), which test above holds equal to SDPA.
    q, k, v = (t.detach() for t in heads(torch.float32))
    attention = MathAttention(window)
    positions_BS = torch.arange(20, 24).expand(q.shape[0], 4)
    over_cache = attention.with_cache(q[:, :, 20:], k, v, positions_BS)
    torch.testing.assert_close(over_cache, attention(q, k, v)[:, :, 20:], rtol=1e-5, atol=1e-5)


def test_decoding_with_math_attention_equals_decoding_with_sdpa():
    # A tiny decoder's cached decoding (prefill, then one token at a time) through each attention op: the model's
    # own forward calls the op's form over the cache (fp32, 1e-5).
    from titanpod.models import DecoderArgs, ModelOps, Transformer
    from titanpod.models.common.kv_cache import KVCache

    args = DecoderArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=50, ffn_dim=64, max_seq_len=32)
    torch.manual_seed(0)
    sdpa_model = Transformer(args)
    sdpa_model.init_weights(0)
    math_model = Transformer(args, ModelOps(attention=MathAttention()))
    math_model.load_state_dict(sdpa_model.state_dict())
    tokens_BS = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    states = []
    for model in (sdpa_model, math_model):
        cache = KVCache.for_model(model, 2, 16)
        with torch.no_grad():
            prefill = model.hidden_states_with_cache(tokens_BS[:, :8], cache, start_position=0)
            steps = [model.hidden_states_with_cache(tokens_BS[:, i : i + 1], cache, start_position=i)
                     for i in range(8, 12)]  # fmt: skip
        states.append(torch.cat([prefill, *steps], dim=1))
    torch.testing.assert_close(states[1], states[0], rtol=1e-5, atol=1e-5)
