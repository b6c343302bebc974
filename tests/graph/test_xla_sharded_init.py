"""The xla lane creates parameters sharded: each device's shard is drawn from the region init alone,
never the whole parameter on the host, and the arrays equal one torch process's ``init_weights`` bit for bit.

One subprocess on 8 host devices (torchax must not load in the pytest process).
"""

from __future__ import annotations

import math

from tests.conftest import XLA_ENV, run_json_script

SCRIPT = """
import json, math
import numpy as np, torch
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, build_step, train
from titanpod.models import region_initializer
from titanpod.recipes.families import build_model
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan
from titanpod.parallel.xla_executor import create_params

backend = get_backend("xla")
result = {}
for family, degrees in (("llama3", {"fsdp": 4, "tp": 2}), ("qwen3_moe", {"fsdp": 2, "ep": 4})):
    axes = ParallelConfig(**degrees).mesh_axes(8)
    mesh = backend.build_mesh({k: v for k, v in axes.items() if v > 1})
    whole = build_model(family, "debug", device="cpu")
    whole.init_weights(5)
    meta = build_model(family, "debug")
    draw = region_initializer(meta, 5)
    largest = {}

    def values(name, region):
        largest[name] = max(largest.get(name, 0), math.prod(piece.stop - piece.start for piece in region))
        return draw(name, region)

    shapes = {n: tuple(p.shape) for n, p in meta.named_parameters()}
    with backend.runtime():
        created = create_params(shapes, values, mesh, sharding_plan(family), axes)
    result[family] = {
        "wrong": [n for n, p in whole.named_parameters() if not np.array_equal(created[n], p.detach().numpy())],
        "dtypes": sorted({str(a.dtype) for a in created.values()}),
        # the largest region drawn at once, as a share of the parameter, against the plan's local share
        "over_share": [
            n for n, p in whole.named_parameters()
            if largest[n] != sharding_plan(family).local_numel(n, tuple(p.shape), axes)
        ],
        "wq_spec": str(created["layers.0.attention.wq.weight"].sharding.spec),
    }

# the step: a meta model with initial_values trains exactly like the same init placed from the host
generator = torch.Generator().manual_seed(1)
data = [torch.randint(0, 2048, (8, 33), generator=generator) for _ in range(2)]
config = TrainConfig(steps=2, warmup_steps=1, log_every=2, step_mode="whole_step")
axes = ParallelConfig(fsdp=4, tp=2).mesh_axes(8)
losses, models = {}, {}
for start in ("meta", "host"):
    model = build_model("llama3", "debug", device="meta" if start == "meta" else "cpu")
    if start == "host":
        model.init_weights(5)
    values = region_initializer(model, 5) if start == "meta" else None
    step = build_step(model, config, backend, plan=sharding_plan("llama3"), axes=axes, initial_values=values)
    batches = iter([(d[:, :-1], d[:, 1:]) for d in data])
    losses[start] = train(model, batches, config, backend, flops_per_token=1.0, step=step).losses
    models[start] = model
result["losses"] = losses
pairs = zip(models["meta"].parameters(), models["host"].parameters(), strict=True)
result["finished_equal"] = all(torch.equal(p, q) for p, q in pairs)
result["finished_on"] = sorted({p.device.type for p in models["meta"].parameters()})
print(json.dumps(result))
"""


def test_xla_parameters_created_sharded_equal_the_torch_init_and_train_alike():
    """llama3 on fsdp=4 x tp=2 and qwen3_moe on fsdp=2 x ep=4: every array equals the torch one-process
    init bit for bit, and no device's shard was drawn larger than the plan's share of its parameter. A
    step built on a meta model (``initial_values``) gives the same losses, bit for bit, as the same
    init placed from the host, and ``finish()`` materialises the meta model with the trained weights."""
    found = run_json_script(SCRIPT, env=XLA_ENV)
    for family in ("llama3", "qwen3_moe"):
        assert found[family]["wrong"] == [], family
        assert found[family]["over_share"] == [], family
        assert found[family]["dtypes"] == ["float32"], family
    assert found["llama3"]["wq_spec"] == "P('tp', 'fsdp')"
    assert found["losses"]["meta"] == found["losses"]["host"]
    assert len(found["losses"]["meta"]) == 2 and all(math.isfinite(loss) for loss in found["losses"]["meta"])
    assert found["finished_equal"] and found["finished_on"] == ["cpu"]
