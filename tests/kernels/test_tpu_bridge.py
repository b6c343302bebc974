"""What the tpu lane hands torch_tpu, checked without torch_tpu (envs/tpu checks it against the real one).

torch_tpu builds each kernel's op schema from ``inspect.signature(kernel, eval_str=True)``: every
parameter needs a type annotation it knows (``jax.Array``), and PyTorch's schema inference refuses
``*args``. A kernel signature that regresses to either fails here.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
import torch

from titanpod.kernels import KernelConfig, model_ops
from titanpod.kernels.jax_custom_op import pallas_interpret
from titanpod.kernels.tpu_bridge import explicit_arity
from titanpod.kernels.tpu_splash import TorchTpuSplashAttention


@pytest.mark.parametrize("arity", [1, 3, 4])
def test_kernels_reach_torch_tpu_with_one_annotated_parameter_per_array(arity):
    def add_all(*arrays):
        return sum(arrays[1:], arrays[0])

    kernel = explicit_arity(add_all, arity)
    signature = inspect.signature(inspect.unwrap(kernel), eval_str=True)
    kinds = [p.kind for p in signature.parameters.values()]
    assert kinds == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * arity  # no *args
    assert [p.annotation for p in signature.parameters.values()] == [jax.Array] * arity
    assert signature.return_annotation == tuple[jax.Array, ...]
    # The kernel still computes what the function does, as a tuple (torch_tpu's Tensor[]).
    out = kernel(*[jnp.full((2,), float(i)) for i in range(arity)])
    assert isinstance(out, tuple) and len(out) == 1
    assert out[0].tolist() == [float(sum(range(arity)))] * 2


def test_pallas_runs_compiled_for_tensors_on_a_tpu_without_asking_jax():
    tpu = SimpleNamespace(type="tpu")  # torch.device("tpu") exists only once torch_tpu registers it
    assert pallas_interpret(None, tpu) is False  # type: ignore[arg-type]
    assert pallas_interpret(True, tpu) is True  # type: ignore[arg-type]
    # Host tensors reach JAX on its CPU backend, where Mosaic cannot lower, even on a TPU machine.
    assert pallas_interpret(None, torch.device("cpu")) is True


def test_torch_tpu_splash_is_selectable_and_names_what_it_cannot_do():
    ops = model_ops(KernelConfig(attention="splash_sdpa"))
    assert isinstance(ops.attention, TorchTpuSplashAttention)
    q = torch.zeros(1, 4, 128, 16)
    kv = torch.zeros(1, 2, 128, 16)
    with pytest.raises(ValueError, match="tpu lane only"):
        ops.attention(q, kv, kv)
    with pytest.raises(ValueError, match=r"no document mask.*'splash'"):
        ops.attention(q, kv, kv, torch.zeros(1, 128, dtype=torch.long))
    with pytest.raises(ValueError, match=r"kernels\.attention must be one of sdpa, splash, splash_sdpa"):
        model_ops(KernelConfig(attention="flash"))
