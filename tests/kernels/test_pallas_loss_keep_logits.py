"""The Pallas loss with ``keep_logits``: the forward writes the logits, the backward reads them (6 N V M flops).

Parity: forward loss and gradients of the hidden states and head against plain cross-entropy over full logits,
in Pallas interpret mode, through JAX's autodiff as the xla lane runs it (under ``jax.checkpoint`` with the head
slot's policy, which keeps what the kernels return) and through the PyTorch op as the torch lanes run it
(``jax_op``: the gradient op reruns the forward). Tolerances: fp32 2e-5 on the loss and 8e-5 on the gradients;
bf16 3e-2 on the loss and 1.2e-1 on the gradients (the kept logits are rounded to bf16, as MaxText keeps its
own), both relative and absolute.

Legend: N rows, M model width, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

from tests.kernels.test_kernel_costs import pallas_costs, walk
from tests.kernels.test_kernel_parity import compare
from titanpod.graph.xla.head import kernel_outputs_saveable
from titanpod.kernels import PallasLinearCrossEntropy, PallasLossConfig
from titanpod.kernels.pallas_loss import loss_cost_estimates, make_pallas_cross_entropy
from titanpod.models import IGNORE_INDEX, linear_cross_entropy

TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}
KEEP = PallasLossConfig(block_rows=16, block_vocab=128, keep_logits=True)


def reference_loss(h_NM: jax.Array, w_VM: jax.Array, labels_N: jax.Array) -> jax.Array:
    """Mean cross-entropy over full float32 logits, rows labelled ``IGNORE_INDEX`` left out."""
    logits_NV = h_NM.astype(jnp.float32) @ w_VM.astype(jnp.float32).T
    valid = labels_N != IGNORE_INDEX
    target = jnp.take_along_axis(logits_NV, jnp.where(valid, labels_N, 0)[:, None], axis=1)[:, 0]
    return jnp.where(valid, jax.nn.logsumexp(logits_NV, axis=1) - target, 0.0).sum() / valid.sum()


def inputs(n: int, m: int, v: int, dtype: jnp.dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    keys = jax.random.split(jax.random.key(7), 3)
    h = jax.random.normal(keys[0], (n, m), jnp.float32).astype(dtype)
    w = (jax.random.normal(keys[1], (v, m), jnp.float32) * 0.3).astype(dtype)
    labels = jax.random.randint(keys[2], (n,), 0, v).at[:7].set(IGNORE_INDEX).at[-1].set(v - 1)
    return h, w, labels


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(("n", "v"), [(74, 300), (40, 100)], ids=["partial_tiles", "one_partial_vocab_tile"])
def test_kept_logits_loss_matches_the_reference_under_the_head_slots_checkpoint(dtype, n, v):
    h, w, labels = inputs(n, 32, v, dtype)
    loss = make_pallas_cross_entropy(KEEP, v, 32, interpret=True, itemsize=jnp.dtype(dtype).itemsize)
    checkpointed = jax.checkpoint(loss, policy=kernel_outputs_saveable)
    got, got_grads = jax.value_and_grad(checkpointed, argnums=(0, 1))(h, w, labels)
    want, want_grads = jax.value_and_grad(reference_loss, argnums=(0, 1))(h, w, labels)
    tol = TOLERANCE[dtype]
    assert abs(float(got) - float(want)) <= tol * (1 + abs(float(want)))
    for a, b in zip(got_grads, want_grads, strict=True):
        assert a.dtype == dtype
        assert jnp.allclose(a.astype(jnp.float32), b.astype(jnp.float32), atol=4 * tol, rtol=4 * tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kept_logits_op_matches_the_reference_on_the_torch_lanes(dtype):
    g = torch.Generator().manual_seed(4)
    h = torch.randn(2, 37, 32, generator=g).to(dtype)
    w = (torch.randn(300, 32, generator=g) * 0.3).to(dtype)
    labels = torch.randint(0, 300, (2, 37), generator=g)
    labels[0, :7] = IGNORE_INDEX
    compare(PallasLinearCrossEntropy(KEEP), linear_cross_entropy, [h, w, labels], dtype)


def test_the_backward_reads_the_kept_logits_and_does_6_nvm_flops():
    """Under the head slot's checkpoint the forward runs once; both gradient kernels take its [N, V] logits
    (in the inputs' dtype) and declare one matmul each."""
    config = PallasLossConfig(block_rows=128, block_vocab=512, keep_logits=True)
    N, M, V = 256, 64, 1000  # two vocabulary tiles, the second partial: computed as 1,024 columns
    loss = jax.checkpoint(make_pallas_cross_entropy(config, V, M, interpret=True, itemsize=2),
                          policy=kernel_outputs_saveable)  # fmt: skip
    h, w = jnp.ones((N, M), jnp.bfloat16), jnp.ones((V, M), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(h, w, jnp.zeros((N,), jnp.int32)).jaxpr
    calls = [eqn for eqn in walk(jaxpr) if eqn.primitive.name == "pallas_call"]
    assert len(calls) == 3
    logits = calls[0].outvars[-1]
    assert (logits.aval.shape, logits.aval.dtype) == ((N, V), jnp.bfloat16)
    for eqn in calls[1:]:  # the kept logits cross the checkpoint's boundary as another variable of their type
        assert [var.aval for var in eqn.invars].count(logits.aval) == 1
    costs = [cost for _, cost in pallas_costs(jaxpr)]
    expected = loss_cost_estimates(N, V, M, 2, config)
    assert costs == [expected["forward"], expected["grad_h"], expected["grad_w"]]
    assert sum(c.flops for c in costs) == 6 * N * 1024 * M


def test_keeping_the_logits_declares_their_bytes():
    """The forward writes N x V logits more than the recomputing loss, and the gradient kernels read them."""
    N, M, V = 256, 64, 1000
    kept = loss_cost_estimates(N, V, M, 2, PallasLossConfig(block_rows=128, block_vocab=512, keep_logits=True))
    recomputed = loss_cost_estimates(N, V, M, 2, PallasLossConfig(block_rows=128, block_vocab=512))
    assert kept["forward"].bytes_accessed - recomputed["forward"].bytes_accessed == N * V * 2
    assert kept["forward"].flops == recomputed["forward"].flops
    assert kept["grad_h"].flops == recomputed["grad_h"].flops // 2
    assert kept["grad_w"].flops == recomputed["grad_w"].flops // 2
