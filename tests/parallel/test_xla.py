"""The XLA executor: the same plan as NamedShardings on 8 host devices, compiled by jax.jit."""

from __future__ import annotations

from tests.conftest import XLA_ENV, run_json_script

XLA_STEP = """
import json, jax, numpy as np, torch
from jax.sharding import NamedSharding
from torchax.interop import jax_view
from titanpod.device import get_backend
from titanpod.recipes.families import build_model
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan
from titanpod.parallel.xla_executor import batch_partition_spec, place_params

family, degrees = "{family}", {degrees}
model = build_model(family, "debug", device="cpu")
model.init_weights(0)
tokens = torch.randint(0, 2048, (8, 32), generator=torch.Generator().manual_seed(1))
reference = model.loss(tokens, tokens).item()

class Loss(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
    def forward(self, tokens, labels):
        return self.inner.loss(tokens, labels)

wrapper = Loss(model)
backend = get_backend("xla")
axes = ParallelConfig(**degrees).mesh_axes(8)
mesh = backend.build_mesh({{k: v for k, v in axes.items() if v > 1}})
params = place_params(dict(model.named_parameters()), sharding_plan(family), mesh, axes)
loss_fn = jax_view(
    lambda p, t, l: torch.func.functional_call(wrapper, {{"inner." + k: v for k, v in p.items()}}, (t, l))
)
batch = jax.device_put(np.asarray(tokens), NamedSharding(mesh, batch_partition_spec(axes)))
step = jax.jit(jax.value_and_grad(loss_fn))
with backend.runtime():
    loss, grads = step(params, batch, batch)
hlo = step.lower(params, batch, batch).compile().as_text()
spec = str(params["layers.0.attention.wq.weight"].sharding.spec)
ops = ("all-gather", "all-reduce", "reduce-scatter")
counts = {{op: hlo.count(op + "(") + hlo.count(op + "-start(") for op in ops}}
print(json.dumps({{"loss": float(loss), "reference": reference, "wq_spec": spec, "collectives": counts}}))
"""


def run_case(family: str, degrees: dict) -> dict:
    return run_json_script(XLA_STEP.format(family=family, degrees=degrees), env=XLA_ENV)


def test_fsdp4_tp2_step_matches_the_torch_loss_and_holds_collectives():
    out = run_case("llama3", {"fsdp": 4, "tp": 2})
    assert abs(out["loss"] - out["reference"]) <= 1e-5 * out["reference"]
    assert out["wq_spec"] == "P('tp', 'fsdp')"  # heads over tp, input width over fsdp
    assert out["collectives"]["all-gather"] > 0
    assert out["collectives"]["all-reduce"] + out["collectives"]["reduce-scatter"] > 0
