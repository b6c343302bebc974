"""Bucketed FSDP gathers, in one process: packing and cutting buckets, which parameters may be bucketed, config checks.

The collectives themselves are checked on real processes in ``test_torchrun.py`` and in a
traced step in ``test_trace.py``; here a gather over R ranks is simulated by laying the R
ranks' packed shards end to end, which is what ``all_gather_into_tensor`` returns.
"""

from __future__ import annotations

import pytest
import torch

from titanpod.parallel import ParallelConfig, PlanError
from titanpod.parallel.torch_executor.bucket_layout import BucketEntry, BucketLayout
from titanpod.parallel.torch_executor.bucketed_fsdp import DataSplit, data_split
from titanpod.parallel.torch_executor.simple_fsdp import layout_for
from titanpod.recipes.families import sharding_plan

RANKS = 4
# (whole shape, shard dimension): matrices split on rows and on columns (the plans shard the
# column-parallel weights and the embeddings on dimension 1), a 3-d tensor split on its last, a vector
WHOLES = [((8, 6), 0), ((6, 8), 1), ((3, 5, 8), 2), ((12,), 0), ((4, 4), 1)]


def layout_and_wholes(seed: int = 0) -> tuple[BucketLayout, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    wholes = [torch.randn(shape, generator=generator) for shape, _ in WHOLES]
    entries = []
    for whole, (_, dim) in zip(wholes, WHOLES, strict=True):
        entries.append(BucketEntry(tuple(whole.chunk(RANKS, dim)[0].shape), dim))
    return BucketLayout(tuple(entries), RANKS), wholes


def shards_of(rank: int, wholes: list[torch.Tensor]) -> list[torch.Tensor]:
    """Rank ``rank``'s shard of each whole tensor, as a DTensor Shard(dim) placement holds it."""
    return [whole.chunk(RANKS, dim)[rank] for whole, (_, dim) in zip(wholes, WHOLES, strict=True)]


def test_a_gathered_bucket_is_cut_into_the_whole_parameters_whatever_dimension_they_were_split_on():
    layout, wholes = layout_and_wholes()
    gathered = torch.cat([layout.pack_shards(shards_of(rank, wholes), torch.float32) for rank in range(RANKS)])
    assert gathered.shape == (RANKS * layout.shard_numel,)
    cut = layout.unpack_gathered(gathered)
    for got, want in zip(cut, wholes, strict=True):
        assert got.shape == want.shape
        assert torch.equal(got, want)


def test_gradients_of_the_whole_parameters_come_back_packed_rank_major_for_one_reduce_scatter():
    layout, wholes = layout_and_wholes()
    gathered = torch.cat([layout.pack_shards(shards_of(rank, wholes), torch.float32) for rank in range(RANKS)])
    gathered.requires_grad_(True)
    _, grads = layout_and_wholes(seed=1)
    torch.autograd.backward(layout.unpack_gathered(gathered), grads)
    rows = gathered.grad.view(RANKS, layout.shard_numel)
    for rank in range(RANKS):  # row r is what reduce-scatter hands rank r: its shard of every gradient
        assert torch.equal(rows[rank], layout.pack_shards(shards_of(rank, grads), torch.float32))


def test_a_reduced_bucket_is_cut_back_into_shards_and_packing_checks_shapes_and_casts():
    layout, wholes = layout_and_wholes()
    shards = shards_of(2, wholes)
    packed = layout.pack_shards(shards, torch.bfloat16)
    assert packed.dtype == torch.bfloat16
    for got, want in zip(layout.unpack_shards(layout.pack_shards(shards, torch.float32)), shards, strict=True):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match=r"shape \(6, 8\) was given where \(6, 2\) belongs"):
        layout.pack_shards([shards[0], wholes[1], *shards[2:]], torch.float32)
    with pytest.raises(ValueError, match="holds 5 parameters but 4 shards"):
        layout.pack_shards(shards[:4], torch.float32)
    with pytest.raises(ValueError, match="cannot be split on dimension 2"):
        BucketLayout((BucketEntry((4, 4), 2),), RANKS)


def split_of(name: str, axes: dict[str, int], sequence_parallel: bool = False) -> DataSplit | None:
    mesh_axes = tuple(axis for axis, size in axes.items() if size > 1)
    rule = sharding_plan("qwen3_moe").rule_for(name)
    return data_split(layout_for(rule, axes, mesh_axes, sequence_parallel), mesh_axes)


def test_only_parameters_gathered_and_reduced_over_data_axes_alone_are_bucketed():
    wq, wo, norm = "layers.0.attention.wq.weight", "layers.0.attention.wo.weight", "layers.0.ffn_norm.weight"
    expert, q_norm = "layers.0.feed_forward.experts.w1", "layers.0.attention.q_norm.weight"
    fsdp_cp = {"fsdp": 2, "cp": 2}
    assert split_of(wq, fsdp_cp) == DataSplit(("fsdp", "cp"), 1, ())
    assert split_of(wo, fsdp_cp) == DataSplit(("fsdp", "cp"), 0, ())
    hsdp = {"dp_replicate": 2, "fsdp": 2}
    assert split_of(wq, hsdp) == DataSplit(("fsdp",), 1, ("dp_replicate",))
    fsdp_ep = {"fsdp": 2, "ep": 2}
    assert split_of(wq, fsdp_ep) == DataSplit(("fsdp", "ep"), 1, ())  # ep ranks shard the non-experts too
    assert split_of(expert, fsdp_ep) is None  # split over ep for compute, gradient scaled
    assert split_of(expert, {"fsdp": 4}) == DataSplit(("fsdp",), 1, ())
    assert split_of(q_norm, {"fsdp": 4}) is None  # stored whole: nothing to gather
    fsdp_tp = {"fsdp": 2, "tp": 2}
    assert split_of(wq, fsdp_tp) is None  # split over tp
    assert split_of(norm, fsdp_tp, sequence_parallel=False) == DataSplit(("fsdp",), 0, ())  # same on every tp rank
    assert split_of(norm, fsdp_tp, sequence_parallel=True) is None  # its gradient sums over tp


def test_bucket_settings_are_checked():
    with pytest.raises(PlanError, match="fsdp_bucket_mb=-1"):
        ParallelConfig(fsdp_bucket_mb=-1)
    with pytest.raises(PlanError, match="fsdp_prefetch needs buckets"):
        ParallelConfig(fsdp_bucket_mb=0, fsdp_prefetch=True)
