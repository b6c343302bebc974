"""``train.sum_gradients_in_loop``: a step of several micro-batches whose blocks' loop adds each micro-batch's
gradient into the running sum trains as the step that sums after each backward, holding one copy of the blocks'
gradients instead of two.

In one subprocess on 8 host CPU devices (torchax must not load in the pytest process), fp32, the same batches, 3
steps of 2 micro-batches each, blocks stacked (``scan_layers``), memory policy ``recompute``:
- llama3 debug over fsdp 4 x tp 2 (the FSDP gather inside the recomputed block);
- qwen3_moe debug over fsdp 4 x ep 2, tokens dropped, so each block's router logits and dropped count come out of
  the loop and their cotangents go back into it.
And ``summing_scan`` itself, in JAX alone: its gradient with respect to the stacked arrays is the sums plus the
plain loop's, the shared inputs' the plain loop's, over blocks that give out a tensor besides their carry.

Tolerances (fp32): losses within 1e-6 relative and gradient norms within 1e-5 (measured: the first step's equal, the
others 5e-7 and 4e-6 apart for qwen3_moe); every parameter and AdamW moment within 1e-5 absolute for llama3; for
qwen3_moe, at most 1 element in 10,000 more than 1e-5 apart and none more than lr (measured: 52 of 5.4 million,
the largest 1.9e-4): its recomputed blocks round a few sums differently from JAX's own backward of the loop, and
Adam, dividing each update by the root of its second moment, turns a rounding difference in a near-zero gradient
element into one of up to lr (see tests/graph/test_xla_scan_layers.py). ``summing_scan``'s gradients within 1e-6
relative of the plain loop's plus the sums.
"""

from __future__ import annotations

import pytest

from tests.conftest import XLA_ENV, run_json_script
from titanpod.graph import TrainConfig

SCRIPT = """
import dataclasses, json, numpy as np, torch
import jax, jax.numpy as jnp
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.graph.xla import XlaStep
from titanpod.graph.xla.gradient_sums import summing_scan
from titanpod.recipes.families import build_model, get_flavor, sharding_plan
from titanpod.parallel import ParallelConfig

generator = torch.Generator().manual_seed(1)
data = [torch.randint(0, 2048, (8, 33), generator=generator) for _ in range(6)]
backend = get_backend("xla")

def model_of(family):
    args = get_flavor(family, "debug")
    if args.moe is not None:
        args = dataclasses.replace(args, moe=dataclasses.replace(args.moe, capacity_factor=1.0))
    model = build_model(family, args, device="cpu")
    model.init_weights(0)
    return model

def run(family, axes, in_loop):
    config = TrainConfig(steps=3, warmup_steps=1, log_every=1, grad_accum_steps=2, step_mode="whole_step",
                         memory_policy="recompute", scan_layers=True, sum_gradients_in_loop=in_loop)
    model = model_of(family)
    step = XlaStep(model, config, backend, plan=sharding_plan(family), axes=axes)
    batches = iter([(d[:, :-1], d[:, 1:]) for d in data])
    summary = train(model, batches, config, backend, flops_per_token=1.0, step=step)
    state = {"/".join(map(str, key)): np.asarray(value) for key, value in flat(step.state_dict())}
    compiled = step.lower([(d[:, :-1], d[:, 1:]) for d in data[:2]]).compile()
    temporaries = compiled.memory_analysis().temp_size_in_bytes
    gradient_bytes = sum(int(np.prod(p.shape)) * 4 for p, s in zip(step.jax_params, step.layer_stack.entries)
                         if ".*." in s)
    dropped = [r.dropped_tokens for r in summary.reports]
    norms = [r.grad_norm for r in summary.reports]
    return summary.losses, dropped, state, temporaries, gradient_bytes, norms

def flat(tree, prefix=()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from flat(value, (*prefix, key))
        else:
            yield (*prefix, key), value

result = {}
for family, axes in (("llama3", ParallelConfig(fsdp=4, tp=2)), ("qwen3_moe", ParallelConfig(fsdp=4, ep=2))):
    after = run(family, axes.mesh_axes(8), False)
    inside = run(family, axes.mesh_axes(8), True)
    keys = sorted(after[2])
    result[family] = {
        "losses": [after[0], inside[0]],
        "dropped": [after[1], inside[1]],
        "same_keys": keys == sorted(inside[2]),
        "state_max_abs": max(float(np.abs(after[2][k] - inside[2][k]).max()) for k in keys),
        "state_worst": max(keys, key=lambda k: float(np.abs(after[2][k] - inside[2][k]).max())),
        "moved": float(np.abs(after[2]["model/layers.1.attention.wq.weight"]
                              - model_of(family).layers[1].attention.wq.weight.detach().numpy()).max()),
        "temporaries": [after[3], inside[3]],
        "stacked_gradient_bytes": after[4],
        "grad_norms": [after[5], inside[5]],
        "elements": sum(int(after[2][k].size) for k in keys),
        "elements_over": sum(int((np.abs(after[2][k] - inside[2][k]) > 1e-5).sum()) for k in keys),
    }

# summing_scan alone: 3 blocks of a matrix and a bias, a shared scale (float) and ids (integer), a sum given out
def step(carry, slices, shared):
    weight, bias = slices
    scale, ids = shared
    following = jnp.tanh(carry @ weight + bias) * scale + ids.astype(jnp.float32) * 0.01
    return following, jnp.sum(following, axis=-1)

def plain(params, x, ids):
    weight, bias, scale = params
    last, outs = jax.lax.scan(lambda c, s: step(c, s, [scale, ids]), x, [weight, bias])
    return jnp.sum(last ** 2) + jnp.sum(outs ** 2)

def summing(params, sums, x, ids):
    weight, bias, scale = params
    last, outs = summing_scan(step, x, [weight, bias], sums, [scale, ids])
    return jnp.sum(last ** 2) + jnp.sum(outs ** 2)

keys = jax.random.split(jax.random.key(0), 5)
params = [jax.random.normal(keys[0], (3, 8, 8)) / 3, jax.random.normal(keys[1], (3, 8)), jnp.float32(1.3)]
x = jax.random.normal(keys[2], (2, 8))
ids = jnp.arange(16).reshape(2, 8)
sums = [jax.random.normal(keys[3], (3, 8, 8)), jax.random.normal(keys[4], (3, 8))]
want = jax.grad(plain)(params, x, ids)
got = jax.grad(summing)(params, sums, x, ids)
wanted_x = jax.grad(plain, argnums=1)(params, x, ids)
got_x = jax.grad(summing, argnums=2)(params, sums, x, ids)
scale = lambda a: float(jnp.max(jnp.abs(a)))
result["summing_scan"] = {
    "stacked": [scale(g - s - w) / scale(w) for g, s, w in zip(got[:2], sums, want[:2])],
    "shared": abs(float(got[2]) - float(want[2])) / abs(float(want[2])),
    "input": scale(got_x - wanted_x) / scale(wanted_x),
    "values": float(abs(plain(params, x, ids) - summing(params, sums, x, ids))),
}
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def runs() -> dict:
    return run_json_script(SCRIPT, env=XLA_ENV, timeout=900)


@pytest.mark.parametrize("family", ["llama3", "qwen3_moe"])
def test_summing_in_the_loop_trains_like_summing_after_each_backward(runs, family):
    run = runs[family]
    after, inside = run["losses"]
    assert len(after) == 3
    assert inside == pytest.approx(after, rel=1e-6)
    assert run["same_keys"]
    assert run["grad_norms"][1] == pytest.approx(run["grad_norms"][0], rel=1e-5)
    if family == "llama3":
        assert run["state_max_abs"] <= 1e-5, run["state_worst"]
    else:
        assert run["elements_over"] <= run["elements"] / 10_000, run["state_worst"]
        assert run["state_max_abs"] <= TrainConfig().lr, run["state_worst"]
    assert run["moved"] > 1e-4  # the parameters did train
    assert run["dropped"][0] == run["dropped"][1]
    if family == "qwen3_moe":
        assert min(run["dropped"][0]) > 0  # tokens were dropped: the blocks' other outputs were in play


@pytest.mark.parametrize("family", ["llama3", "qwen3_moe"])
def test_summing_in_the_loop_holds_one_copy_of_the_blocks_gradients(runs, family):
    run = runs[family]
    after, inside = run["temporaries"]
    # a device's share of the stacked gradients: the sum's second copy, which the loop's sum does without
    share = run["stacked_gradient_bytes"] / 8
    assert after - inside >= 0.9 * share, (after, inside, share)


def test_the_summing_loops_gradient_is_the_sums_plus_the_plain_loops(runs):
    check = runs["summing_scan"]
    assert max(check["stacked"]) <= 1e-6
    assert check["shared"] <= 1e-6  # a float input every block reads: its cotangents summed over the blocks
    assert check["input"] <= 1e-6
    assert check["values"] == 0.0
