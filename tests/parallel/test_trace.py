"""SimpleFSDP's collectives are ordinary ops in a traced training step."""

from __future__ import annotations

from tests.conftest import run_python

TRACE = """
import torch, torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.distributed.fake_pg import FakeStore
from titanpod.device import get_backend
from titanpod.models import build_model
from titanpod.parallel import PLANS, ParallelConfig
from titanpod.parallel.torch_executor import parallelize

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
model = build_model("llama3", "debug", device="cpu")
model.init_weights(0)
parallelize(model, PLANS["llama3"], ParallelConfig(fsdp=4), get_backend("cpu"))
params = list(model.parameters())

def step(tokens):
    loss = model.loss(tokens, tokens)
    return loss, torch.autograd.grad(loss, params)

graph = make_fx(step)(torch.randint(0, 2048, (2, 16)))
targets = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
print(len(params), targets.count("_c10d_functional.all_gather_into_tensor.default"),
      targets.count("_c10d_functional.reduce_scatter_tensor.default"))
"""


def test_traced_simple_fsdp_step_holds_one_gather_and_one_reduce_scatter_per_parameter():
    result = run_python(TRACE, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    params, gathers, scatters = map(int, result.stdout.split())
    assert params == 57  # 6 layers x 9 + embeddings, final norm, output
    assert gathers == params and scatters == params
