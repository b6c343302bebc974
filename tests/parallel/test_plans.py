"""Sharding plans as data: coverage of every parameter, divisibility, degrees, placements."""

from __future__ import annotations

import pytest
from torch.distributed.tensor import Partial, Replicate, Shard

from titanpod.parallel import ParallelConfig, ParamRule, PlanError
from titanpod.parallel.torch_executor.simple_fsdp import layout_for
from titanpod.recipes.families import MODEL_SPECS, build_model, sharding_plan


@pytest.mark.parametrize("family", sorted(MODEL_SPECS))
def test_every_parameter_of_every_flavor_has_a_rule(family):
    for flavor in MODEL_SPECS[family].flavors:
        for name, _ in build_model(family, flavor).named_parameters():
            sharding_plan(family).rule_for(name)


def test_parallel_degrees_fill_fsdp_and_name_the_problem():
    whole = {"pp": 1, "dp_replicate": 1, "fsdp": 8, "cp": 1, "ep": 1, "tp": 1}
    assert ParallelConfig().mesh_axes(8) == whole
    assert list(ParallelConfig().mesh_axes(8)) == ["pp", "dp_replicate", "fsdp", "cp", "ep", "tp"]  # outermost first
    assert ParallelConfig(dp_replicate=2, tp=2).mesh_axes(8) == {**whole, "dp_replicate": 2, "fsdp": 2, "tp": 2}
    assert ParallelConfig(pp=2, cp=2).mesh_axes(8) == {**whole, "pp": 2, "fsdp": 2, "cp": 2}
    with pytest.raises(PlanError, match=r"pp=2 x cp=2 x fsdp=3 does not divide into 8 processes"):
        ParallelConfig(pp=2, cp=2, fsdp=3).mesh_axes(8)
    with pytest.raises(PlanError, match=r"does not divide into 6 processes"):
        ParallelConfig(tp=4).mesh_axes(6)
    with pytest.raises(PlanError, match=r"product is 4"):
        ParallelConfig(fsdp=3).mesh_axes(4)
    with pytest.raises(PlanError, match="at least 1"):
        ParallelConfig(tp=0).mesh_axes(4)


def test_dimensions_that_do_not_divide_are_all_listed():
    model = build_model("llama3", "debug")  # 4 kv heads x 16 = 64 rows in wk; ffn 768
    named = dict(model.named_parameters())
    with pytest.raises(PlanError) as caught:
        sharding_plan("llama3").check(named, {"dp_replicate": 1, "fsdp": 1, "ep": 1, "tp": 128})
    message = str(caught.value)
    assert "layers.*.attention.wk.weight (64, 256): dimension 0 (64) cannot split 128 ways" in message
    assert "layers.*.attention.wv.weight" in message and "Choose parallel degrees" in message
    assert message.count("layers.*.attention.wk.weight") == 1  # one line for all six layers
    assert "feed_forward" not in message  # 768 splits 128 ways
    sharding_plan("llama3").check(named, {"dp_replicate": 1, "fsdp": 4, "ep": 1, "tp": 2})


def test_context_parallel_ranks_share_the_parameter_shards():
    named = dict(build_model("llama3", "debug").named_parameters())
    axes = {"fsdp": 2, "cp": 2, "ep": 1, "tp": 1}
    assert sharding_plan("llama3").splits("layers.0.attention.wq.weight", axes)[1] == 4  # fsdp x cp
    assert sharding_plan("llama3").local_numel("tok_embeddings.weight", (2048, 256), axes) == 2048 * 64
    layout = layout_for(ParamRule("w", shard_dim=1, tp_dim=0), axes, ("fsdp", "cp"))
    assert layout.stored == (Shard(1), Shard(1))
    assert layout.compute == (Replicate(), Replicate())
    assert layout.grad == (Partial("avg"), Partial("avg"))
    sharding_plan("llama3").check(named, axes)


def test_a_parameter_without_a_rule_is_named():
    with pytest.raises(PlanError, match=r"'lm_head\.bias'"):
        sharding_plan("llama3").rule_for("lm_head.bias")


def test_placements_of_a_column_parallel_weight_under_hsdp_and_tp():
    axes = {"dp_replicate": 2, "fsdp": 2, "ep": 1, "tp": 2}
    layout = layout_for(ParamRule("w", shard_dim=1, tp_dim=0), axes, ("dp_replicate", "fsdp", "tp"))
    assert layout.stored == (Replicate(), Shard(1), Shard(0))
    assert layout.compute == (Replicate(), Replicate(), Shard(0))
    assert layout.grad == (Partial("avg"), Partial("avg"), Shard(0))
    assert layout.grad_scale == 1.0


def test_placements_of_experts_and_per_head_norms():
    axes = {"dp_replicate": 1, "fsdp": 2, "ep": 2, "tp": 1}
    experts = layout_for(ParamRule("e", shard_dim=1, ep_dim=0), axes, ("fsdp", "ep"))
    assert experts.stored == (Shard(1), Shard(0)) and experts.compute == (Replicate(), Shard(0))
    assert experts.grad == (Partial("avg"), Shard(0)) and experts.grad_scale == 0.5
    dense = layout_for(ParamRule("d", shard_dim=0), axes, ("fsdp", "ep"))
    assert dense.stored == (Shard(0), Shard(0)) and dense.grad == (Partial("avg"), Partial("avg"))
    norm = layout_for(ParamRule("n", shard_dim=0, tp_grad="sum"), {"fsdp": 2, "tp": 2}, ("fsdp", "tp"))
    assert norm.compute == (Replicate(), Replicate()) and norm.grad == (Partial("avg"), Partial("sum"))


def test_an_axis_the_mesh_lacks_is_named():
    named = dict(build_model("llama3", "debug").named_parameters())
    with pytest.raises(PlanError, match=r"Mesh axes sp are not ones a plan can use; the axes are pp, dp_replicate"):
        sharding_plan("llama3").check(named, {"fsdp": 2, "sp": 2})


def test_local_numel_is_each_ranks_share_and_whole_parameters_stay_whole():
    plan = sharding_plan("qwen3")
    axes = {"dp_replicate": 1, "fsdp": 32, "ep": 8, "tp": 1}
    assert plan.local_numel("layers.3.attention.wq.weight", (8192, 4096), axes) == 8192 * 4096 // 256
    assert plan.local_numel("layers.3.attention.q_norm.weight", (128,), axes) == 128  # kept whole
    assert plan.local_numel("tok_embeddings.weight", (151936, 4096), axes) == 151936 * 16  # split on the width
    assert plan.local_numel("layers.0.feed_forward.experts.w1", (128, 1536, 4096), axes) == 16 * 48 * 4096
    assert plan.local_numel("norm.weight", (100,), {"fsdp": 8}) == 13  # uneven: rounded up, as padded shards are


def test_a_whole_parameter_is_replicated_with_an_averaged_gradient():
    layout = layout_for(ParamRule("n", shard_dim=None, tp_grad="sum"), {"fsdp": 4, "tp": 2}, ("fsdp", "tp"))
    assert layout.stored == (Replicate(), Replicate())
    assert layout.grad == (Partial("avg"), Partial("sum"))


def test_every_flux_parameter_has_a_rule_and_dev_shards_over_eight_devices():
    from titanpod.models.flux import FLUX_FLAVORS, build_flux_transformer

    plan = sharding_plan("flux")
    for flavor in FLUX_FLAVORS:
        named = dict(build_flux_transformer(flavor).named_parameters())
        for name in named:
            plan.rule_for(name)
    named = dict(build_flux_transformer("dev").named_parameters())
    plan.check(named, {"dp_replicate": 1, "fsdp": 8, "ep": 1, "tp": 1})
    assert plan.local_numel("double_blocks.0.img_attn.q_norm.weight", (128,), {"fsdp": 8}) == 128
    assert plan.local_numel("single_blocks.3.linear1.weight", (21504, 3072), {"fsdp": 8}) == 21504 * 3072 // 8


def test_flux_splits_heads_and_fused_blocks_over_tp():
    from titanpod.models.flux import build_flux_transformer

    plan = sharding_plan("flux")
    named = dict(build_flux_transformer("dev").named_parameters())
    plan.check(named, {"fsdp": 4, "tp": 8})  # 24 heads: 3 a tp rank
    axes = {"fsdp": 4, "tp": 2}
    assert plan.local_numel("single_blocks.3.linear1.weight", (21504, 3072), axes) == 21504 * 3072 // 8
    assert plan.local_numel("single_blocks.3.linear1.bias", (21504,), axes) == 21504 // 2  # whole over fsdp
    assert plan.rule_for("double_blocks.0.txt_attn.wo.bias").tp_dim is None  # added once, after the sum
    with pytest.raises(PlanError, match=r"single_blocks\.0\.linear1\.weight \(448, 64\): dimension 0 \(448\)"):
        plan.check(dict(build_flux_transformer("debug").named_parameters()), {"tp": 3})  # 448 rows: 7 blocks of 64


def test_a_fused_tp_dimension_is_stored_split_and_computed_whole_with_a_summed_gradient():
    rule = ParamRule("linear1.weight", shard_dim=1, tp_dim=0, tp_blocks=7)
    layout = layout_for(rule, {"fsdp": 2, "tp": 2}, ("fsdp", "tp"))
    assert layout.stored == (Shard(1), Shard(0))  # one region a rank, as checkpoints read it
    assert layout.compute == (Replicate(), Replicate()) and layout.grad == (Partial("avg"), Partial("sum"))
    assert layout.blockwise == (0, 7, 1)
