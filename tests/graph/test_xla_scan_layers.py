"""``train.scan_layers``: the xla step running its blocks as one ``lax.scan`` trains exactly as the unrolled one.

Both steps run in one subprocess on 8 host CPU devices (torchax must not load in the pytest process),
fp32, on the same batches, 3 steps of 2 micro-batches each:
- llama3 debug over fsdp 4 x tp 2, memory policy ``recompute`` (the FSDP gather and ``jax.checkpoint``
  inside the scan's body);
- qwen3_moe debug over fsdp 4 x ep 2 with expert capacity for one fair share, so tokens are dropped and
  the router logits and dropped counts must come out of the scan for the load-balancing loss and metric.

Tolerances (fp32): losses within 1e-6 relative (measured: identical), every parameter and AdamW moment after
the updates within 1e-5 absolute (measured: 0.0 for llama3, whose scanned body compiles to the unrolled block's
arithmetic; 2.6e-6 for qwen3_moe, where XLA orders a few float sums differently in the loop and Adam, which
divides each update by the root of its second moment, turns a rounding difference in a near-zero gradient
element into one of up to about lr; see test_xla_step), and the MoE dropped counts equal.
"""

from __future__ import annotations

import pytest

from tests.conftest import XLA_ENV, run_json_script

SCRIPT = """
import dataclasses, json, numpy as np, torch
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.graph.xla import XlaStep
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

def run(family, axes, scan):
    config = TrainConfig(steps=3, warmup_steps=1, log_every=1, grad_accum_steps=2, step_mode="whole_step",
                         memory_policy="recompute", scan_layers=scan)
    model = model_of(family)
    step = XlaStep(model, config, backend, plan=sharding_plan(family), axes=axes)
    batches = iter([(d[:, :-1], d[:, 1:]) for d in data])
    summary = train(model, batches, config, backend, flops_per_token=1.0, step=step)
    state = {"/".join(map(str, key)): np.asarray(value) for key, value in flat(step.state_dict())}
    hlo = step.lower([(d[:, :-1], d[:, 1:]) for d in data[:2]]).as_text()
    dropped = [r.dropped_tokens for r in summary.reports]
    return summary.losses, dropped, state, hlo.count("stablehlo.while"), hlo.count("dot_general"), step

def flat(tree, prefix=()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from flat(value, (*prefix, key))
        else:
            yield (*prefix, key), value

result = {}
for family, axes in (("llama3", ParallelConfig(fsdp=4, tp=2)), ("qwen3_moe", ParallelConfig(fsdp=4, ep=2))):
    unrolled = run(family, axes.mesh_axes(8), False)
    scanned = run(family, axes.mesh_axes(8), True)
    keys = sorted(unrolled[2])
    result[family] = {
        "losses": [unrolled[0], scanned[0]],
        "dropped": [unrolled[1], scanned[1]],
        "same_keys": keys == sorted(scanned[2]),
        "state_max_abs": max(float(np.abs(unrolled[2][k] - scanned[2][k]).max()) for k in keys),
        "state_worst": max(keys, key=lambda k: float(np.abs(unrolled[2][k] - scanned[2][k]).max())),
        "moved": float(np.abs(unrolled[2]["model/layers.1.attention.wq.weight"]
                              - model_of(family).layers[1].attention.wq.weight.detach().numpy()).max()),
        "whiles": [unrolled[3], scanned[3]],
        "dots": [unrolled[4], scanned[4]],
        "layers": len(model_of(family).layers),
    }
    step = scanned[5]
    entry = step.layer_stack.entries.index("layers.*.attention.wq.weight")
    result[family]["stacked_shape"] = list(step.jax_params[entry].shape)
    # load_state_dict takes the per-layer tree back and restacks it
    before = step.state_dict()
    step.load_state_dict({key: value for key, value in before.items()})
    after = step.state_dict()
    result[family]["reload_max_abs"] = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for (_, a), (_, b) in zip(flat(before), flat(after), strict=True)
    )
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def runs() -> dict:
    return run_json_script(SCRIPT, env=XLA_ENV, timeout=900)


@pytest.mark.parametrize("family", ["llama3", "qwen3_moe"])
def test_scanned_blocks_train_like_unrolled_blocks(runs, family):
    run = runs[family]
    unrolled, scanned = run["losses"]
    assert len(unrolled) == 3
    assert scanned == pytest.approx(unrolled, rel=1e-6)
    assert run["same_keys"]  # the checkpoint layout names every layer's parameters, stacked or not
    # fp32 element by element: the MoE's experts gather and reduce-scatter inside gmm's own shard_map, whose
    # sums XLA orders differently in and out of the loop; AdamW then moves near-zero gradients apart (measured 1.7e-5).
    assert run["state_max_abs"] <= (1e-5 if family == "llama3" else 5e-5), run["state_worst"]
    assert run["moved"] > 1e-4  # the parameters did train
    assert run["dropped"][0] == run["dropped"][1]
    if family == "qwen3_moe":
        assert min(run["dropped"][0]) > 0  # the capacity limit did drop tokens, so the counts were compared
    assert run["reload_max_abs"] == 0.0


@pytest.mark.parametrize("family", ["llama3", "qwen3_moe"])
def test_the_scanned_program_holds_one_block_and_the_step_holds_stacked_parameters(runs, family):
    run = runs[family]
    layers = run["layers"]
    assert layers >= 2
    assert run["stacked_shape"][0] == layers
    assert run["whiles"][1] > run["whiles"][0]  # the blocks' loops (forward and backward), beside the micro-batch one
    assert run["dots"][1] < run["dots"][0]  # one block's matmuls in the program instead of one set a block


def test_blocks_that_differ_cannot_be_stacked():
    from titanpod.graph.xla.layer_stack import LayerStack

    names = ["embed.weight", "layers.0.w.weight", "layers.1.w.weight"]
    with pytest.raises(ValueError, match=r"layers\.1 differs from layers\.0 in w\.weight.*scan_layers=false"):
        LayerStack.of(names, [(4, 2), (2, 2), (3, 2)], layers=2)
    stack = LayerStack.of(names, [(4, 2), (2, 2), (2, 2)], layers=2)
    assert stack.entries == ("embed.weight", "layers.*.w.weight")
    assert stack.members[1] == ("layers.0.w.weight", "layers.1.w.weight")
    assert stack.entry_shape(1, (2, 2)) == (2, 2, 2)


def test_each_block_list_stacks_on_its_own():
    from titanpod.graph.xla.layer_stack import LayerStack

    names = ["t.img_in.weight", "t.double.0.w", "t.double.1.w", "t.single.0.w", "t.single.0.b", "t.single.1.w",
             "t.single.1.b", "t.single.2.w", "t.single.2.b", "t.final.weight"]  # fmt: skip
    shapes = [(2, 2), (3, 2), (3, 2), (4, 2), (4,), (4, 2), (4,), (4, 2), (4,), (2, 2)]
    stack = LayerStack.of(names, shapes, {"t.double": 2, "t.single": 3})
    assert stack.entries == ("t.img_in.weight", "t.double.*.w", "t.single.*.w", "t.single.*.b", "t.final.weight")
    assert stack.members[3] == ("t.single.0.b", "t.single.1.b", "t.single.2.b")
    assert [stack.entry_shape(i, s) for i, s in ((0, (2, 2)), (1, (3, 2)), (3, (4,)))] == [(2, 2), (2, 3, 2), (3, 4)]
    assert stack.by_list(range(5)) == {"t.double": [1], "t.single": [2, 3]} and stack.layers == 5
    per_name = {name: float(i) for i, name in enumerate(names)}
    assert stack.unstack(stack.stack(per_name)) == per_name  # the step's arrays hold every block's parameters
    with pytest.raises(ValueError, match=r"t\.single\.2 differs from t\.single\.0 in w"):
        LayerStack.of(names, [*shapes[:7], (5, 2), (4,), (2, 2)], {"t.double": 2, "t.single": 3})
