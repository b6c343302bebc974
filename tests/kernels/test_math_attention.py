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
