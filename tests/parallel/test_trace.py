"""SimpleFSDP's collectives are ordinary ops in a traced training step."""

from __future__ import annotations

import json

from tests.conftest import run_python

TRACE = """
import torch, torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.distributed.fake_pg import FakeStore
from titanpod.device import get_backend
from titanpod.recipes.families import build_model
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan
from titanpod.parallel.torch_executor import parallelize

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
model = build_model("llama3", "debug", device="cpu")
model.init_weights(0)
parallelize(model, sharding_plan("llama3"), ParallelConfig(fsdp=4, fsdp_bucket_mb=0), get_backend("cpu"))
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
from titanpod.recipes.families import build_model
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan
from titanpod.parallel.torch_executor import parallelize

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
model = build_model("llama3", "debug", device="cpu")
model.init_weights(0)
config = ParallelConfig(fsdp=2, param_dtype="bfloat16", reduce_dtype="float32")
parallelize(model, sharding_plan("llama3"), config, get_backend("cpu"))
wq = model.layers[0].attention.wq
stored = wq._parameters["weight"]
model.loss(torch.randint(0, 2048, (2, 8)), torch.randint(0, 2048, (2, 8))).backward()
print(wq.weight.dtype, stored.dtype, tuple(stored.to_local().shape), stored.grad.dtype)
"""


def test_mixed_precision_computes_in_param_dtype_and_keeps_fp32_masters_and_grads():
    result = run_python(MIXED_PRECISION, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["torch.bfloat16", "torch.float32", "(256,", "128)", "torch.float32"]


BUCKETED = """
import json, sys, torch, torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.distributed.fake_pg import FakeStore
from titanpod.device import get_backend
from titanpod.recipes.families import build_model
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan
from titanpod.parallel.torch_executor import parallelize

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
counts = {}
for case, config in {
    "fsdp4": ParallelConfig(fsdp=4, fsdp_bucket_mb=25, fsdp_prefetch=True),
    "hsdp2x2": ParallelConfig(dp_replicate=2, fsdp=2, fsdp_bucket_mb=25),
    "fsdp4_small": ParallelConfig(fsdp=4, fsdp_bucket_mb=0.5),
}.items():
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(0)
    buckets = parallelize(model, sharding_plan("llama3"), config, get_backend("cpu")).buckets
    params = list(model.parameters())

    def step(tokens):
        loss = model.loss(tokens, tokens)
        return loss, torch.autograd.grad(loss, params)

    graph = make_fx(step)(torch.randint(0, 2048, (2, 16)))
    targets = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    counts[case] = {
        "buckets": len(buckets.buckets),
        "layer_buckets": sum(path.startswith("layers.") for path, _ in buckets.buckets),
        **{op: targets.count(f"_c10d_functional.{op}.default")
           for op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")},
    }
model = build_model("llama3", "debug", device="cpu")
model.init_weights(0)
config = ParallelConfig(fsdp=4, fsdp_bucket_mb=25, param_dtype="bfloat16", reduce_dtype="float32")
parallelize(model, sharding_plan("llama3"), config, get_backend("cpu"))
wq = model.layers[0].attention.wq
seen = []
wq.register_forward_pre_hook(lambda module, args: seen.append(str(module.weight.dtype)))
model.loss(torch.randint(0, 2048, (2, 8)), torch.randint(0, 2048, (2, 8))).backward()
stored = wq._parameters["weight"]
counts["mixed"] = [*seen, str(stored.dtype), str(stored.grad.dtype), str(type(stored.grad).__name__)]
print(json.dumps(counts))
"""


def test_traced_bucketed_step_holds_one_gather_and_one_reduce_scatter_per_bucket_in_param_dtype():
    """llama3 debug: 6 blocks of 9 parameters (2.9 MB whole each), embeddings, final norm, output head.

    With 25 MB buckets each block is one bucket, and so are the embeddings and the final norm;
    the head is read by the loss outside ``output.forward``, so it is gathered alone: 9 of each
    collective instead of 57. HSDP adds one all-reduce over the replicas per bucket. Capped at
    0.5 MB, a block's three 0.75 MB feed-forward weights go one a bucket and its attention
    weights (0.25 + 0.06 + 0.06 + 0.25 MB) with its two norms fill two: 5 buckets a block.
    """
    result = run_python(BUCKETED, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    for case, blocks_of in {"fsdp4": 1, "hsdp2x2": 1, "fsdp4_small": 5}.items():
        got = counts[case]
        assert got["layer_buckets"] == 6 * blocks_of, case
        assert got["all_gather_into_tensor"] == got["reduce_scatter_tensor"] == 6 * blocks_of + 3, case
        assert got["all_reduce"] == (got["all_gather_into_tensor"] if case == "hsdp2x2" else 0), case
    # mixed precision: the bucket computes in bf16, the masters and their gradients stay fp32 DTensors
    assert counts["mixed"] == ["torch.bfloat16", "torch.float32", "torch.float32", "DTensor"]


PREFETCH_RECOMPUTED = """
import json, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, build_step
from titanpod.recipes.families import build_model
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan
from titanpod.parallel.torch_executor import parallelize

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
saved = {}
for prefetch in (False, True):
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(0)
    config = ParallelConfig(fsdp=4, fsdp_bucket_mb=25, fsdp_prefetch=prefetch)
    parallelize(model, sharding_plan("llama3"), config, get_backend("cpu"))
    train = TrainConfig(step_mode="whole_step", memory_policy="recompute", compiler="none")
    step = build_step(model, train, get_backend("cpu"))
    tokens = torch.zeros(1, 2, 16, dtype=torch.long)
    saved[str(prefetch)] = step.prepare(tokens, tokens).meta["activation_plan"].saved_bytes
print(json.dumps(saved))
"""


def test_recompute_gathers_a_prefetched_bucket_again_instead_of_keeping_it():
    """A block's pre-hook starts the next block's gather, so the gathered bucket is read across a
    block boundary; ``recompute`` must still gather it again in the backward, not save it."""
    result = run_python(PREFETCH_RECOMPUTED, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads(result.stdout.strip().splitlines()[-1])
    assert saved["True"] == saved["False"]
