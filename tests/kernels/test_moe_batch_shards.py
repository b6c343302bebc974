"""The MoE layer routes each batch shard's tokens by itself, and gmm's ``per_batch_shard`` makes the xla lane's
data shards those shards.

On one process the batch is one shard (the layer's arithmetic as before). A ``BatchShards`` that splits the
batch into G shards gives each shard its own capacity, from its own tokens: with no capacity limit that changes
nothing; with one, it drops what G processes of a torch lane would each drop. On the xla lane over a mesh
(fsdp 4 x ep 2 on 8 host devices) gmm's ``per_batch_shard`` routes each of the 8 data shards where its tokens
are, and its shard rule takes every expert's rows to its ep rank by an all-to-all: the step then trains as the
cpu eager step does with the batch split in 8 shards (losses within 1e-5 relative, the same dropped choices).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.conftest import XLA_ENV, run_json_script
from titanpod.kernels import GroupedMatmulConfig, MegabloxGroupedMatmul
from titanpod.models.common.args import MoEArgs
from titanpod.models.common.moe import MoE, one_batch_shard
from titanpod.models.common.ops import batched_expert_matmul


@dataclasses.dataclass
class SplitBatch:
    """An expert matmul whose ``per_batch_shard`` runs the batch as ``shards`` equal shards, one after another
    (what as many processes of a torch lane would each route)."""

    inner: object
    shards: int

    def __call__(self, x_ECI: torch.Tensor, w_EOI: torch.Tensor) -> torch.Tensor:
        return self.inner(x_ECI, w_EOI)

    def per_batch_shard(self, fn, *tensors):
        parts = [fn(*chunk) for chunk in zip(*(t.chunk(self.shards) for t in tensors), strict=True)]
        return tuple(torch.cat(outputs) for outputs in zip(*parts, strict=True))


def moe_layer(capacity_factor: float | None, expert_matmul) -> MoE:
    torch.manual_seed(0)
    layer = MoE(16, MoEArgs(n_experts=8, top_k=2, expert_ffn_dim=32, capacity_factor=capacity_factor), expert_matmul)
    for param in layer.parameters():
        torch.nn.init.normal_(param, std=0.3)
    return layer


def test_gmm_outside_the_xla_lane_routes_the_batch_as_one_shard():
    gmm = MegabloxGroupedMatmul(GroupedMatmulConfig(interpret=True))
    x = torch.randn(4, 3)
    assert gmm.per_batch_shard(lambda t: (t * 2,), x)[0].equal(x * 2)
    assert one_batch_shard(lambda t: (t + 1,), x)[0].equal(x + 1)


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_batch_shards_route_their_own_tokens(capacity_factor):
    x_BSM = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(1))
    whole = moe_layer(capacity_factor, batched_expert_matmul)
    split = moe_layer(capacity_factor, SplitBatch(batched_expert_matmul, 4))
    out, logits, dropped = whole(x_BSM)
    out_split, logits_split, dropped_split = split(x_BSM)
    torch.testing.assert_close(logits_split, logits)
    # each row alone, as its own batch: what the split layer must give, drops included
    rows = [whole(x_BSM[b : b + 1]) for b in range(4)]
    torch.testing.assert_close(out_split, torch.cat([r[0] for r in rows]))
    assert int(dropped_split) == sum(int(r[2]) for r in rows)
    if capacity_factor is None:  # nothing drops: one shard or four, the same
        torch.testing.assert_close(out_split, out)
        assert int(dropped) == int(dropped_split) == 0
    else:
        assert int(dropped_split) > 0
    # gradients flow through the shards' dispatch and combine
    out_split.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in split.parameters())


SCRIPT = """
import dataclasses, json, torch
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.graph.xla import XlaStep
from titanpod.kernels import KernelConfig, model_ops
from titanpod.recipes.families import build_model, get_flavor
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan
from tests.kernels.test_moe_batch_shards import SplitBatch

generator = torch.Generator().manual_seed(1)
data = [torch.randint(0, 2048, (8, 33), generator=generator) for _ in range(2)]

def moe_model(shards):
    args = get_flavor("qwen3_moe", "debug")
    args = dataclasses.replace(args, moe=dataclasses.replace(args.moe, capacity_factor=1.0))
    ops = model_ops(KernelConfig(expert_matmul="gmm"))
    if shards > 1:
        ops = dataclasses.replace(ops, expert_matmul=SplitBatch(ops.expert_matmul, shards))
    model = build_model("qwen3_moe", args, ops, device="cpu")
    model.init_weights(0)
    return model

def trained(lane, shards=1, axes=None):
    mode = "whole_step" if lane == "xla" else "eager"
    config = TrainConfig(steps=2, lr=3e-4, warmup_steps=1, log_every=1, step_mode=mode)
    model, backend = moe_model(shards), get_backend(lane)
    step = None if lane == "cpu" else XlaStep(model, config, backend, plan=sharding_plan("qwen3_moe"), axes=axes)
    batches = iter([(d[:, :-1], d[:, 1:]) for d in data])
    summary = train(model, batches, config, backend, flops_per_token=1.0, step=step)
    return {"losses": summary.losses, "dropped": [r.dropped_tokens for r in summary.reports]}

result = {"cpu_whole": trained("cpu"), "cpu_8_shards": trained("cpu", shards=8),
          "fsdp4_ep2": trained("xla", axes=ParallelConfig(fsdp=4, ep=2).mesh_axes(8))}
print(json.dumps(result))
"""


def test_the_xla_lane_over_fsdp4_x_ep2_routes_each_data_shard_like_eager_shards():
    runs = run_json_script(SCRIPT, env=XLA_ENV)
    assert runs["fsdp4_ep2"]["losses"] == pytest.approx(runs["cpu_8_shards"]["losses"], rel=1e-5)
    assert runs["fsdp4_ep2"]["dropped"] == runs["cpu_8_shards"]["dropped"]
    # per-shard capacity drops other choices than one capacity over the whole batch (more: less pooling)
    assert runs["cpu_8_shards"]["dropped"] != runs["cpu_whole"]["dropped"]
