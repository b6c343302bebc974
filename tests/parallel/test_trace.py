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


MIXED_PRECISION = """
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from titanpod.device import get_backend
from titanpod.models import build_model
from titanpod.parallel import PLANS, ParallelConfig
from titanpod.parallel.torch_executor import parallelize

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
model = build_model("llama3", "debug", device="cpu")
model.init_weights(0)
config = ParallelConfig(fsdp=2, param_dtype="bfloat16", reduce_dtype="float32")
parallelize(model, PLANS["llama3"], config, get_backend("cpu"))
wq = model.layers[0].attention.wq
stored = wq._parameters["weight"]
model.loss(torch.randint(0, 2048, (2, 8)), torch.randint(0, 2048, (2, 8))).backward()
print(wq.weight.dtype, stored.dtype, tuple(stored.to_local().shape), stored.grad.dtype)
"""


def test_mixed_precision_computes_in_param_dtype_and_keeps_fp32_masters_and_grads():
    result = run_python(MIXED_PRECISION, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["torch.bfloat16", "torch.float32", "(256,", "128)", "torch.float32"]
