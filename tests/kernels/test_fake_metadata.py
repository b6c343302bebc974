"""Every jax_op kernel's fake (what tracing sees) has the real outputs' shape, dtype and strides.

A captured step plans its views and copies from the fakes; a fake whose strides differ
from the tensors that arrive at run time breaks the step (e.g. ``view`` on a gradient
that is contiguous where the fake said transposed). Each kernel runs forward and backward
on small inputs laid out as the models make them (q, k, v transposed from [B, S, H, D]);
every call of a ``titanpod`` op on the way is repeated under ``FakeTensorMode`` on fakes
of the same inputs, and the two results' metadata must be equal.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from titanpod.kernels import (
    GroupedMatmulConfig,
    MegabloxGroupedMatmul,
    PallasLinearCrossEntropy,
    PallasLossConfig,
    SplashAttention,
    SplashConfig,
)


def metadata(value):
    return tree_map(lambda t: (tuple(t.shape), t.dtype, t.stride()) if isinstance(t, torch.Tensor) else t, value)


class FakeAgainstReal(TorchDispatchMode):
    """Runs every ``titanpod`` op again on fakes of its inputs and records (op, real, fake) metadata."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, object, object]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "titanpod":
            with FakeTensorMode() as mode:
                fake_args, fake_kwargs = tree_map(
                    lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, (args, kwargs)
                )
                fake = func(*fake_args, **fake_kwargs)
            self.calls.append((str(func), metadata(out), metadata(fake)))
        return out


def splash_case(dtype):
    B, S, H, K, D = 2, 128, 4, 2, 64  # the model makes [B, S, H, D] and transposes to [B, H, S, D]
    q = torch.randn(B, S, H, D, dtype=dtype, requires_grad=True)
    k = torch.randn(B, S, K, D, dtype=dtype, requires_grad=True)
    v = torch.randn(B, S, K, D, dtype=dtype, requires_grad=True)
    attention = SplashAttention(SplashConfig(block_q=128, block_kv=128))
    out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2).sum(), [q, k, v]


def splash_documents_case(dtype):
    B, S, H, D = 1, 128, 2, 64
    q, k, v = (torch.randn(B, S, H, D, dtype=dtype, requires_grad=True) for _ in range(3))
    ids = torch.cat([torch.zeros(B, 50, dtype=torch.long), torch.ones(B, 78, dtype=torch.long)], dim=1)
    attention = SplashAttention(SplashConfig(block_q=128, block_kv=128))
    out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), ids)
    return out.sum(), [q, k, v]


def pallas_loss_case(dtype):
    B, S, M, V = 2, 24, 32, 100
    h = torch.randn(B, M, S, dtype=dtype).transpose(1, 2).requires_grad_(True)  # not contiguous
    w = torch.randn(V, M, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, V, (B, S))
    loss = PallasLinearCrossEntropy(PallasLossConfig(block_rows=16, block_vocab=64))(h, w, labels)
    return loss, [h, w]


def gmm_case(dtype):
    E, C, I, O = 2, 8, 32, 48  # noqa: E741 - the kernel's legend
    x = torch.randn(E, I, C, dtype=dtype).transpose(1, 2).requires_grad_(True)  # not contiguous
    w = torch.randn(E, O, I, dtype=dtype, requires_grad=True)
    out = MegabloxGroupedMatmul(GroupedMatmulConfig(tile_rows=16, tile_in=32, tile_out=16))(x, w)
    return out.sum(), [x, w]


CASES = {"splash": splash_case, "splash_documents": splash_documents_case,
         "pallas_loss": pallas_loss_case, "gmm": gmm_case}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fakes_match_real_outputs_forward_and_backward(case, dtype):
    torch.manual_seed(0)
    checker = FakeAgainstReal()
    with checker:
        loss, inputs = CASES[case](dtype)
        loss.backward()
    ops = [name for name, _, _ in checker.calls]
    assert len(ops) == 2 and ops[1].endswith("_backward.default"), ops  # one forward, one backward
    for name, real, fake in checker.calls:
        assert real == fake, f"{name}: real {real} vs fake {fake}"
    assert all(x.grad is not None for x in inputs)
