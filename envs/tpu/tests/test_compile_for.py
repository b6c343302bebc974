"""``--compile-for``: the debug recipes' whole steps, with their Pallas kernels, compiled by libtpu for a v5p slice.

These are the smallest cases of what the pod recipes do (``titanpod-pretrain --recipe NAME --compile-for
target``): the same program builder, plan, kernels (Splash, the Pallas loss, gmm, compiled by Mosaic) and
report. The compiler's flops must be the model's training flops times the memory policy's recompute, within
20%: far below that, work is hidden from the cost analysis (a loop body counted once, a kernel with no cost).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from titanpod.device.tpu_slices import parse_slice
from titanpod.kernels import KernelConfig
from titanpod.recipes import get_recipe
from titanpod.runs.slice_compile import compile_for_slice, extrapolated

RECOMPUTE = {"save": 1.0, "recompute": 4 / 3}
"""Forward passes a step runs, over the training count's one: recompute runs each block's forward twice."""

PALLAS = KernelConfig(attention="splash", head_loss="pallas", expert_matmul="gmm")


def pod_like(name: str, policy: str = "recompute"):
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
        train=dataclasses.replace(recipe.train, step_mode="whole_step", memory_policy=policy, precision="bf16"),
        data=dataclasses.replace(recipe.data, batch_size=2),
    )


@pytest.mark.parametrize("name", ["llama3_debug", "qwen3_moe_debug"])
def test_debug_recipe_compiles_for_v5p_with_its_kernels(name: str) -> None:
    recipe = pod_like(name)
    report, compiled = compile_for_slice(recipe, parse_slice("v5p-8"), say=lambda _: None)
    assert report.kernels == {"attention": "splash", "head_loss": "pallas", "expert_matmul": "gmm"}
    assert report.mesh == {"fsdp": 4}
    assert report.fits and report.program.memory.total < report.chip_hbm
    assert report.program.memory.arguments > 0 and report.program.memory.temporaries > 0
    # the parameters and both moments sharded four ways: the arguments hold a quarter of them, and the batch
    parameters = sum(p.numel() for p in _model(recipe).parameters())
    assert report.program.memory.arguments >= 3 * 4 * parameters / 4
    assert report.program.memory.arguments < 3 * 4 * parameters / 4 * 1.2 + 2**20
    assert report.flops_ratio == pytest.approx(RECOMPUTE["recompute"], rel=0.2)
    # no loop hides work (one micro-batch; collective matmuls off): the only loops are gmm's tile-map searches
    assert all("searchsorted" in source for source in report.program.loop_sources)
    assert report.step_seconds is not None and report.step_seconds > 0
    assert {"all-gather", "reduce-scatter"} <= set(report.program.collectives)  # FSDP's gathers and reductions
    data = json.loads(json.dumps(report.to_dict()))
    assert data["estimated_mfu"] == pytest.approx(report.estimated_mfu)
    assert compiled.memory_analysis() is not None


def test_depth_extrapolation_matches_a_full_compile() -> None:
    recipe = pod_like("llama3_debug")  # 6 layers
    tpu = parse_slice("v5p-8")
    full, _ = compile_for_slice(recipe, tpu, say=lambda _: None)
    two, _ = compile_for_slice(recipe, tpu, layers=2, say=lambda _: None)
    four, _ = compile_for_slice(recipe, tpu, layers=4, say=lambda _: None)
    guess = extrapolated(two, four)
    assert guess.layers == full.layers == 6 and guess.extrapolated_from == (2, 4)
    assert guess.program.flops == pytest.approx(full.program.flops, rel=0.02)
    assert guess.model_flops_per_chip == pytest.approx(full.model_flops_per_chip, rel=1e-9)
    assert guess.program.memory.arguments == pytest.approx(full.program.memory.arguments, rel=0.02)
    assert guess.step_seconds == pytest.approx(full.step_seconds, rel=0.1)


def test_command_writes_the_report_and_exits_by_fit(tmp_path) -> None:
    from titanpod.pretrain.cli import main

    out = tmp_path / "compiled"
    code = main(["--recipe", "llama3_debug", "--compile-for", "v5p-8", "--compile-output", str(out)])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["slice"] == "v5p-8" and report["fits"] is True
    assert report["program"]["memory"]["total"] > 0
    # a batch far too large for one chip's HBM does not fit: exit 1, and still a report
    code = main(["--recipe", "llama3_debug", "--compile-for", "v5p-8", "--data.batch-size", "4096",
                 "--data.seq-len", "4096", "--compile-output", str(out)])  # fmt: skip
    assert code == 1
    assert json.loads((out / "report.json").read_text())["fits"] is False


def test_bad_slice_is_refused_before_any_work() -> None:
    from titanpod.pretrain.cli import main

    assert main(["--recipe", "llama3_debug", "--compile-for", "v5p-7"]) == 2


def _model(recipe):
    from titanpod.kernels import model_ops
    from titanpod.models import build_model

    return build_model(recipe.model.family, recipe.model.args(), model_ops(recipe.kernels))
