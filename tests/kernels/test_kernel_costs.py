"""The Pallas kernels' declared costs and Splash's device-free construction, on the CPU (traced only).

A compiled program counts a Pallas call as the ``cost_estimate`` it declares (the TPU compiles in
envs/tpu/tests/test_kernel_tpu_compile.py check the totals); here the estimates are read off the
traced gradient: one per Pallas call, scaled by ``jax.vmap`` over the batch and kv heads. Splash's
mask tables are numpy arrays, equal to those JAX's own factory makes, so one kernel serves every
trace that uses it.

Legend: B batch, H query heads, K key/value heads, G = H / K, S sequence, D head dim, N rows,
M model width, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.extend.core import ClosedJaxpr, Jaxpr

from titanpod.kernels import PallasLossConfig, SplashAttention, SplashConfig
from titanpod.kernels.pallas_loss import loss_cost_estimates, make_pallas_cross_entropy
from titanpod.kernels.splash import splash_mqa_kernel

B, H, K, S, D = 2, 4, 2, 512, 128
G = H // K
TILE = 128


def walk(jaxpr: Jaxpr) -> list[Any]:
    """Every equation of ``jaxpr`` and of the jaxprs its equations call (a Pallas kernel's body left out)."""
    found = []
    for eqn in jaxpr.eqns:
        found.append(eqn)
        if eqn.primitive.name == "pallas_call":
            continue
        for value in eqn.params.values():
            for inner in value if isinstance(value, tuple) else (value,):
                if isinstance(inner, ClosedJaxpr):
                    found += walk(inner.jaxpr)
                elif isinstance(inner, Jaxpr):
                    found += walk(inner)
    return found


def pallas_costs(jaxpr: Jaxpr) -> list[tuple[str, Any]]:
    """``(kernel name, declared cost)`` of every Pallas call in ``jaxpr`` and the jaxprs it calls."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append((eqn.params["name"], eqn.params["cost_estimate"]))
            continue
        for value in eqn.params.values():
            for inner in value if isinstance(value, tuple) else (value,):
                if isinstance(inner, ClosedJaxpr):
                    found += pallas_costs(inner.jaxpr)
                elif isinstance(inner, Jaxpr):
                    found += pallas_costs(inner)
    return found


def splash_fn(documents: bool = False, attention: SplashAttention | None = None, **settings: Any) -> Any:
    """The JAX function of a causal Splash op (interpret mode) for [B, H, S, D] queries: built on the
    first call for ``attention`` (or one with ``settings`` of ``SplashConfig``), the same op after."""
    attention = attention or SplashAttention(SplashConfig(block_q=TILE, block_kv=TILE, interpret=True, **settings))
    return attention._op(S, G, D, torch.float32, documents, torch.device("cpu")).fn


def qkv() -> list[jax.Array]:
    keys = jax.random.split(jax.random.key(0), 3)
    return [jax.random.normal(key, (B, h, S, D), jnp.float32) for key, h in zip(keys, (H, K, K), strict=True)]


def test_splash_tables_are_numpy_and_the_same_as_jax_factory_makes():
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    mask = splash.MultiHeadMask([splash.CausalMask((S, S))] * G)
    tiles = splash.BlockSizes(
        block_q=TILE, block_kv=TILE, block_kv_compute=TILE, block_q_dkv=TILE, block_kv_dkv=TILE,
        block_kv_dkv_compute=TILE, block_q_dq=TILE, block_kv_dq=TILE,
    )  # fmt: skip
    ours, _ = splash_mqa_kernel(mask, tiles, D, 4, interpret=True)
    theirs = splash.make_splash_mqa_single_device(mask, block_sizes=tiles, interpret=True)

    our_leaves, our_tree = jax.tree.flatten(ours)
    their_leaves, their_tree = jax.tree.flatten(theirs)
    assert our_tree == their_tree  # the same static arguments (tiles, MQA form, mask function ...)
    assert all(not isinstance(leaf, jax.Array) for leaf in our_leaves)  # no device, no trace holds them
    for our, their in zip(our_leaves, their_leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(our), np.asarray(their))


def test_one_splash_kernel_serves_every_trace_that_uses_it():
    attention = SplashAttention(SplashConfig(block_q=TILE, block_kv=TILE, interpret=True))
    q, k, v = qkv()
    # The op (and its mask tables) is built inside the first trace ...
    first = jax.jit(lambda q, k, v: splash_fn(attention=attention)(q, k, v))(q, k, v)
    # ... and reused by later ones of other kinds (a gradient under remat, an eager call): none sees its values.
    fn = splash_fn(attention=attention)
    grad_q = jax.grad(jax.checkpoint(lambda q: fn(q, k, v).sum()))(q)
    np.testing.assert_allclose(np.asarray(fn(q, k, v)), np.asarray(first), atol=1e-6)
    assert grad_q.shape == q.shape and bool(jnp.isfinite(grad_q).all())
    assert len(attention._ops) == 1


def test_splash_declares_the_flops_of_the_tiles_its_mask_visits():
    fn = splash_fn()
    q, k, v = qkv()
    jaxpr = jax.make_jaxpr(jax.grad(lambda q, k, v: fn(q, k, v).sum(), argnums=(0, 1, 2)))(q, k, v).jaxpr
    found = pallas_costs(jaxpr)
    costs = {name.split("_")[2]: cost for name, cost in found}
    assert len(found) == 3 and set(costs) == {"fwd", "dq", "dkv"}
    visited = (S // TILE) * (S // TILE + 1) // 2  # causal: the tiles on and below the diagonal
    per_matmul = B * H * visited * 2 * TILE * TILE * D  # every (batch, query head): vmap scales one call's estimate
    assert {phase: cost.flops for phase, cost in costs.items()} == {
        "fwd": 2 * per_matmul,
        "dq": 3 * per_matmul,
        "dkv": 4 * per_matmul,
    }
    assert all(cost.transcendentals == B * H * visited * TILE * TILE for cost in costs.values())
    assert all(cost.bytes_accessed > 0 for cost in costs.values())


def test_the_fused_backward_is_one_kernel_of_five_matmuls_with_the_two_kernels_gradients():
    q, k, v = qkv()
    probe = jax.random.normal(jax.random.key(1), (B, H, S, D), jnp.float32)

    def gradients(fn: Any) -> Any:
        return jax.grad(lambda q, k, v: (fn(q, k, v) * probe).sum(), argnums=(0, 1, 2))

    fused, two = splash_fn(fused_backward=True), splash_fn()
    costs = {name.split("_")[2]: cost for name, cost in pallas_costs(jax.make_jaxpr(gradients(fused))(q, k, v).jaxpr)}
    visited = (S // TILE) * (S // TILE + 1) // 2
    per_matmul = B * H * visited * 2 * TILE * TILE * D
    assert {phase: cost.flops for phase, cost in costs.items()} == {"fwd": 2 * per_matmul, "dkv": 5 * per_matmul}
    for got, want in zip(gradients(fused)(q, k, v), gradients(two)(q, k, v), strict=True):  # float32: 2e-5
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=2e-5)


def test_splash_with_document_ids_declares_the_same_flops():
    fn = splash_fn(documents=True)
    q, k, v = qkv()
    ids = jnp.repeat(jnp.arange(4, dtype=jnp.int32), S // 4)[None].repeat(B, axis=0)
    grad = jax.grad(lambda q, k, v: fn(q, k, v, ids).sum(), argnums=(0, 1, 2))
    with_ids = pallas_costs(jax.make_jaxpr(grad)(q, k, v).jaxpr)
    without = pallas_costs(jax.make_jaxpr(jax.grad(lambda q: splash_fn()(q, k, v).sum()))(q).jaxpr)
    assert sorted(c.flops for _, c in with_ids) == sorted(c.flops for _, c in without)


def test_pallas_loss_declares_each_kernels_cost():
    config = PallasLossConfig(block_rows=128, block_vocab=512)
    N, M, V = 256, 64, 1000  # two vocabulary tiles, the second partial: computed as 1,024 columns
    loss = make_pallas_cross_entropy(config, V, M, interpret=True)
    h, w = jnp.ones((N, M), jnp.float32), jnp.ones((V, M), jnp.float32)
    labels = jnp.zeros((N,), jnp.int32)
    costs = [cost for _, cost in pallas_costs(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(h, w, labels).jaxpr)]
    expected = loss_cost_estimates(N, V, M, 4, config)
    assert costs == [expected["forward"], expected["grad_h"], expected["grad_w"]]  # in the order they run
    assert sum(c.flops for c in costs) == 10 * N * 1024 * M


def test_pallas_loss_neither_copies_the_head_nor_widens_its_gradient():
    """The head goes into the kernels as it is (a partial last vocabulary tile, no padded copy), and the
    weight and hidden gradients come out of them in the inputs' dtype (bf16 here), summed in float32 scratch."""
    config = PallasLossConfig(block_rows=128, block_vocab=512)
    N, M, V = 256, 64, 1000
    loss = make_pallas_cross_entropy(config, V, M, interpret=True, itemsize=2)
    h, w = jnp.ones((N, M), jnp.bfloat16), jnp.ones((V, M), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(h, w, jnp.zeros((N,), jnp.int32)).jaxpr
    calls = [eqn for eqn in walk(jaxpr) if eqn.primitive.name == "pallas_call"]
    assert len(calls) == 3
    for eqn in calls:
        assert all(var.aval.shape != (1024, M) for var in [*eqn.invars, *eqn.outvars])  # no padded head
    grad_w = calls[-1].outvars[0].aval
    grad_h = calls[-2].outvars[0].aval
    assert (grad_w.shape, grad_w.dtype) == ((V, M), jnp.bfloat16)
    assert (grad_h.shape, grad_h.dtype) == ((N, M), jnp.bfloat16)
    assert not [eqn for eqn in walk(jaxpr) if eqn.primitive.name == "pad" and eqn.outvars[0].aval.shape[0] != N]
