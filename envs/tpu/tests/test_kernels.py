"""Each Pallas kernel through torch_tpu's bridge (``torch.tpu.pallas.jax_op``): registration, schema,
and the fake outputs (shape, dtype, strides) of its forward and gradient ops.

The inputs are fake tensors on the ``tpu`` device: torch_tpu computes their outputs by exporting the
kernel for the TPU platform, which lowers the Pallas (Mosaic) kernel without needing a chip. They
are checked against titanpod's own fake of the same op on the CPU (``jax.eval_shape``) and against
the PyTorch reference the kernel stands in for, run on meta tensors.

Legend: B batch, H query heads, K key/value heads, S sequence, D head dim, N rows, M model width,
V vocabulary, E experts, C rows per expert, I/O expert input/output width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from titanpod.kernels import GroupedMatmulConfig, PallasLossConfig, SplashConfig
from titanpod.kernels.grouped_matmul import MegabloxGroupedMatmul
from titanpod.kernels.jax_custom_op import JaxOp
from titanpod.kernels.pallas_loss import PallasLinearCrossEntropy
from titanpod.kernels.splash import SplashAttention
from titanpod.kernels.tpu_splash import TorchTpuSplashAttention
from titanpod.models import batched_expert_matmul, linear_cross_entropy, sdpa_attention

BF16 = torch.bfloat16


@dataclass
class Case:
    """A kernel, the shapes and dtypes of its inputs, and the PyTorch reference it replaces."""

    kernel: Any
    inputs: list[tuple[tuple[int, ...], torch.dtype]]
    reference: Any


def cases() -> dict[str, Case]:
    splash = SplashConfig(block_q=128, block_kv=128)
    attention = [((2, 4, 256, 64), BF16), ((2, 2, 256, 64), BF16), ((2, 2, 256, 64), BF16)]
    return {
        "splash": Case(SplashAttention(splash), attention, sdpa_attention),
        "splash_documents": Case(SplashAttention(splash), [*attention, ((2, 256), torch.int64)], sdpa_attention),
        "pallas_loss": Case(
            PallasLinearCrossEntropy(PallasLossConfig()),
            [((2, 128, 256), BF16), ((1024, 256), BF16), ((2, 128), torch.int64)],
            linear_cross_entropy,
        ),
        "gmm": Case(
            MegabloxGroupedMatmul(GroupedMatmulConfig()),
            [((4, 128, 256), BF16), ((4, 512, 256), BF16)],
            batched_expert_matmul,
        ),
    }


def fake_inputs(mode: FakeTensorMode, case: Case, device: str) -> list[torch.Tensor]:
    with mode:
        return [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in case.inputs]


def the_op(kernel: Any) -> JaxOp:
    (op,) = kernel._ops.values()
    return op


def layout(tensor: torch.Tensor) -> tuple[Any, ...]:
    return tuple(tensor.shape), tensor.dtype, tuple(tensor.stride())


@pytest.mark.parametrize("name", list(cases()))
def test_kernel_through_torch_tpu_registers_with_an_explicit_schema_and_matching_fakes(name, tpu_backend):
    case = cases()[name]
    mode = FakeTensorMode()
    on_tpu = fake_inputs(mode, case, "tpu")
    with mode:
        out = case.kernel(*on_tpu)
    assert out.device.type == "tpu"

    # Registration and schema: one Tensor per input, named x0..x{n-1}; a list of tensors out.
    op = the_op(case.kernel)
    namespace, base = op.name.split("::")
    forward = getattr(getattr(torch.ops, namespace), f"{base}_tpu").default
    arguments = ", ".join(f"Tensor x{i}" for i in range(len(on_tpu)))
    assert str(forward._schema) == f"{namespace}::{base}_tpu({arguments}) -> Tensor[]"

    # The fake output matches titanpod's own fake of the op and the reference's (meta tensors).
    meta = [torch.zeros(shape, dtype=dtype, device="meta") for shape, dtype in case.inputs]
    (own,) = op.forward_op(meta) if name != "pallas_loss" else op.forward_op(_loss_rows(meta))
    reference = case.reference(*meta[: 3 if name.startswith("splash") else len(meta)])
    assert layout(out) == layout(own)
    assert tuple(out.shape) == tuple(reference.shape)

    # The gradient op: inputs + output cotangents in, one contiguous gradient per floating input.
    backward = getattr(getattr(torch.ops, namespace), f"{base}_tpu_backward").default
    arguments = ", ".join(f"Tensor x{i}" for i in range(len(on_tpu) + 1))
    assert str(backward._schema) == f"{namespace}::{base}_tpu_backward({arguments}) -> Tensor[]"
    kernel_inputs = _loss_rows(on_tpu) if name == "pallas_loss" else on_tpu
    with mode:
        cotangent = torch.ones_like(out)
        grads = backward(*kernel_inputs, cotangent)
    floating = [t for t in kernel_inputs if t.is_floating_point()]
    assert len(grads) == len(floating)
    for grad, tensor in zip(grads, floating, strict=True):
        assert grad.device.type == "tpu"
        assert layout(grad) == (tuple(tensor.shape), tensor.dtype, tuple(torch.empty(tensor.shape).stride()))


def _loss_rows(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The Pallas loss op's own inputs: hidden states as rows [N, M], the head [V, M], int32 labels [N]."""
    h_BSM, w_VM, labels_BS = inputs
    return [h_BSM.reshape(-1, h_BSM.shape[-1]), w_VM, labels_BS.reshape(-1).to(torch.int32)]


def test_torch_tpu_splash_sdpa_fills_the_attention_slot(tpu_backend):
    mode = FakeTensorMode()
    with mode:
        q = torch.zeros(2, 4, 256, 64, dtype=BF16, device="tpu")
        kv = torch.zeros(2, 2, 256, 64, dtype=BF16, device="tpu")
        out = TorchTpuSplashAttention(SplashConfig(block_q=128, block_kv=128, window=64))(q, kv, kv)
    assert out.device.type == "tpu"
    assert layout(out) == ((2, 4, 256, 64), BF16, (4 * 256 * 64, 256 * 64, 64, 1))


def test_torch_tpu_refuses_the_signatures_the_bridge_avoids(tpu_backend):
    """Why the bridge builds explicit signatures: the two ways a plain wrapper fails in torch_tpu."""

    def varargs(*arrays: jax.Array) -> tuple[jax.Array, ...]:
        return arrays

    with pytest.raises(ValueError, match="varargs"):
        torch.tpu.pallas.jax_op("titanpod::varargs_probe", varargs)

    def annotated_with_a_local_import() -> Any:
        import jax as local_jax

        def kernel(x0: local_jax.Array) -> tuple[local_jax.Array, ...]:
            return (x0,)

        return kernel

    # Annotations are strings here (``from __future__ import annotations``); torch_tpu evaluates
    # them in the function's module, where a name imported inside a function does not exist.
    with pytest.raises(NameError, match="local_jax"):
        torch.tpu.pallas.jax_op("titanpod::local_import_probe", annotated_with_a_local_import())
