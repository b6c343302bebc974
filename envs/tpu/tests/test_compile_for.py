"""``--compile-for``: the debug recipes' whole steps, with their Pallas kernels, compiled by libtpu for a v5p slice.

These are the smallest cases of what the pod recipes do (``titanpod-pretrain --recipe NAME --compile-for
target``): the same command, program builder, plan, kernels (Splash, the Pallas loss, gmm, compiled by Mosaic)
and report. The compiler's flops must be the model's training flops times the memory policy's recompute, within
20%: far below that, work is hidden from the cost analysis (a loop body counted once, a kernel with no cost).
Each compile runs in a fresh interpreter (``compile_in_fresh_process``).
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import compile_in_fresh_process

from titanpod.kernels import KernelConfig, model_ops
from titanpod.recipes import get_recipe
from titanpod.recipes.families import build_model

RECOMPUTE = 4 / 3
"""Forward passes a step runs over the training count's one when every block's forward runs twice."""

PALLAS = KernelConfig(attention="splash", head_loss="pallas", expert_matmul="gmm")


def pod_like(name: str):
    """The debug recipe set as the pod recipes are: Pallas kernels, whole step, recompute, bf16, bf16 gathers;
    a mixture of experts with capacity for exactly its fair share (no capacity limit would give every expert a
    buffer of the whole batch: n_experts / top_k times the experts' work, which the flops check would catch)."""
    recipe = get_recipe(name)
    model = recipe.model
    if model.args().moe is not None:
        model = dataclasses.replace(model, capacity_factor=1.0)
    return dataclasses.replace(
        recipe,
        model=model,
        parallel=dataclasses.replace(recipe.parallel, param_dtype="bfloat16"),
        kernels=PALLAS,
        train=dataclasses.replace(recipe.train, step_mode="whole_step", memory_policy="recompute", precision="bf16"),
        data=dataclasses.replace(recipe.data, batch_size=2),
    )


@pytest.mark.parametrize("name", ["llama3_debug", "qwen3_moe_debug"])
def test_debug_recipe_compiles_for_v5p_with_its_kernels(name: str, tmp_path) -> None:
    recipe = pod_like(name)
    report = compile_in_fresh_process(recipe, tmp_path, "--compile-for", "v5p-8")
    assert report["exit"] == 0 and report["fits"]
    assert report["kernels"] == {"attention": "splash", "head_loss": "pallas", "expert_matmul": "gmm"}
    assert report["mesh"] == {"fsdp": 4}
    memory = report["program"]["memory"]
    assert 0 < memory["total"] < report["chip_hbm"] and memory["temporaries"] > 0
    # the parameters and both fp32 moments sharded four ways: the arguments hold a quarter of them, and the batch
    model = build_model(recipe.model.family, recipe.model.args(), model_ops(recipe.kernels))
    quarter_of_state = 3 * 4 * sum(p.numel() for p in model.parameters()) / 4
    assert quarter_of_state <= memory["arguments"] < quarter_of_state * 1.2 + 2**20
    assert report["flops_ratio"] == pytest.approx(RECOMPUTE, rel=0.2)
    # no loop hides work (one micro-batch; collective matmuls off): the only loops are gmm's tile-map searches
    assert all("searchsorted" in source for source in report["program"]["loop_sources"])
    assert report["estimated_step_seconds"] > 0 and 0 < report["estimated_mfu"] < 1
    assert {"all-gather", "reduce-scatter"} <= set(report["program"]["collectives"])  # FSDP's gathers, reductions


def test_depth_extrapolation_matches_a_full_compile(tmp_path) -> None:
    recipe = pod_like("llama3_debug")  # 6 layers
    full = compile_in_fresh_process(recipe, tmp_path / "full", "--compile-for", "v5p-8")
    guess = compile_in_fresh_process(recipe, tmp_path / "guess", "--compile-for", "v5p-8", "--compile-layers", "2", "4")
    assert guess["layers"] == full["layers"] == 6 and guess["extrapolated_from"] == [2, 4]
    assert guess["program"]["flops"] == pytest.approx(full["program"]["flops"], rel=0.02)
    assert guess["model_flops_per_chip"] == pytest.approx(full["model_flops_per_chip"], rel=1e-9)
    assert guess["program"]["memory"]["arguments"] == pytest.approx(full["program"]["memory"]["arguments"], rel=0.02)
    assert guess["estimated_step_seconds"] == pytest.approx(full["estimated_step_seconds"], rel=0.1)


def test_a_scanned_compile_gives_full_depth_memory_and_unrolled_costs(tmp_path) -> None:
    """With train.scan_layers the full depth compiles as one loop (memory) and 2- and 4-layer unrolled copies
    give the flops and time: within 2% and 10% of the full unrolled compile's, as extrapolation is. The
    scanned program's memory is its own: the arguments (parameters and moments, stacked) equal the unrolled
    step's, and the total is no more than the unrolled step's (measured 51.2 MB against 77.5 MB: libtpu's
    scheduler keeps less alive across one loop body than across six unrolled blocks)."""
    recipe = pod_like("llama3_debug")  # 6 layers
    full = compile_in_fresh_process(recipe, tmp_path / "full", "--compile-for", "v5p-8")
    scan = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, scan_layers=True))
    scanned = compile_in_fresh_process(scan, tmp_path / "scanned", "--compile-for", "v5p-8")
    assert scanned["layers"] == 6 and scanned["cost_from"] == [2, 4] and scanned["extrapolated_from"] == []
    assert scanned["scanned"] and not full["scanned"]
    assert "one loop" in scanned["sources"]["memory"] and "2 and 4" in scanned["sources"]["cost"]
    assert scanned["program"]["flops"] == pytest.approx(full["program"]["flops"], rel=0.02)
    assert scanned["estimated_step_seconds"] == pytest.approx(full["estimated_step_seconds"], rel=0.1)
    memory, unrolled = scanned["program"]["memory"], full["program"]["memory"]
    assert memory["arguments"] == pytest.approx(unrolled["arguments"], rel=0.01)
    assert memory["arguments"] < memory["total"] <= unrolled["total"]
    assert scanned["program"]["while_loops"] >= 2  # the blocks' forward and backward loops


def test_a_step_too_large_for_a_chip_exits_1_with_its_report(tmp_path) -> None:
    recipe = get_recipe("llama3_debug")
    recipe = dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, batch_size=4096, seq_len=4096))
    report = compile_in_fresh_process(recipe, tmp_path, "--compile-for", "v5p-8")
    assert report["exit"] == 1 and report["fits"] is False
    # libtpu refuses to place it at all; a step that compiles too large says so by its figures instead
    assert "HBM" in report["error"] if "error" in report else report["program"]["memory"]["total"] > report["chip_hbm"]


def test_bad_slice_is_refused_before_any_work() -> None:
    from titanpod.pretrain.cli import main

    assert main(["--recipe", "llama3_debug", "--compile-for", "v5p-7"]) == 2
