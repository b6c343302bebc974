"""``titanpod-diffusion --compile-for``: the debug FLUX recipe's whole step compiled by libtpu for a v5p slice.

The smallest case of ``titanpod-diffusion --recipe flux1_12b --compile-for target``: the same command, program
builder (the flow-matching objective over the transformer, the FLUX plan, named batches of latents and text
encodings), memory policy and report. The compiler's flops must be the model's training flops times the recompute
factor within 20%: far below, work is hidden from the cost analysis; far above, the step computes more than the
model needs. The compile runs in a fresh interpreter (``compile_in_fresh_process``).
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import compile_in_fresh_process

from titanpod.models.flux import FLUX_FLAVORS
from titanpod.recipes.diffusion.registry import get_diffusion_recipe

RECOMPUTE = 4 / 3
"""Forward passes a step runs over the training count's one when every block's forward runs twice."""


def pod_like_flux_debug():
    """flux_debug set as flux1_12b is: whole step, recomputed blocks, bf16, bf16 gathers."""
    recipe = get_diffusion_recipe("flux_debug")
    train = dataclasses.replace(recipe.train, step_mode="whole_step", memory_policy="recompute", precision="bf16")
    parallel = dataclasses.replace(recipe.parallel, param_dtype="bfloat16")
    return dataclasses.replace(recipe, train=train, parallel=parallel)


def test_flux_debug_compiles_for_v5p_and_fits(tmp_path) -> None:
    recipe = pod_like_flux_debug()
    report = compile_in_fresh_process(recipe, tmp_path, "--compile-for", "v5p-8", app="titanpod.diffusion.cli")
    assert report["exit"] == 0 and report["fits"]
    assert report["mesh"] == {"fsdp": 4} and report["layers"] == report["model_layers"] == 2
    memory = report["program"]["memory"]
    assert 0 < memory["total"] < report["chip_hbm"] and memory["temporaries"] > 0
    # every chip's share of the batch: 16 x 16 pixels in 2 x 2 patches of 3 channels
    assert report["batch"]["shapes"]["latents"] == [4 * recipe.data.batch_size, 64, 3 * 4]
    assert report["flops_ratio"] == pytest.approx(RECOMPUTE, rel=0.2)
    assert report["images_per_step"] == 4 * recipe.data.batch_size
    assert report["estimated_step_seconds"] > 0 and 0 < report["estimated_mfu"] < 1
    assert report["estimated_images_per_second_per_chip"] > 0
    assert report["program"]["while_loops"] == 0  # one micro-batch, blocks unrolled: nothing counted once
    assert {"all-gather"} <= set(report["program"]["collectives"])  # FSDP's gathers
    args = FLUX_FLAVORS["debug"]
    assert args.depth + args.depth_single == report["layers"]
