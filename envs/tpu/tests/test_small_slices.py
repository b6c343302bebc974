"""``--compile-for`` on slices of one host or less: v5litepod-1, v6e-1 (one chip) and v5litepod-4 (one 2 x 2 host).

libtpu describes a slice by its torus and the chips a host holds; a host grid wider than the torus on any side
(2 x 2 x 1 for a single chip) is refused, so a slice smaller than a host is all one host of its own chips
(``titanpod.device.tpu_slices.host_bounds``). Each case compiles the debug recipe's whole step, with Splash and
the Pallas loss compiled by Mosaic for that chip, in a fresh interpreter.
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import compile_in_fresh_process
from test_compile_for import RECOMPUTE, pod_like

from titanpod.device import CHIPS
from titanpod.kernels import model_ops
from titanpod.recipes.families import build_model


@pytest.mark.parametrize(
    ("name", "slice_name", "chip", "chips"),
    [("v5e-1", "v5litepod-1", "v5e", 1), ("v6e-1", "v6e-1", "v6e", 1), ("v5litepod-4", "v5litepod-4", "v5e", 4)],
)
def test_a_small_slice_compiles_the_step_with_its_kernels(
    name: str, slice_name: str, chip: str, chips: int, tmp_path
) -> None:
    recipe = pod_like("llama3_debug")
    report = compile_in_fresh_process(recipe, tmp_path, "--compile-for", name)
    assert report["exit"] == 0 and report["fits"]
    assert (report["slice"], report["chips"], report["chip_hbm"]) == (slice_name, chips, CHIPS[chip].memory_bytes)
    assert report["mesh"] == {"fsdp": chips}
    assert report["kernels"]["attention"] == "splash" and report["kernels"]["head_loss"] == "pallas"
    assert report["batch"]["batch"] == recipe.data.batch_size * chips  # a sequence batch a chip
    # the parameters and both fp32 moments, each chip holding its share of them
    model = build_model(recipe.model.family, recipe.model.args(), model_ops(recipe.kernels))
    state = 3 * 4 * sum(p.numel() for p in model.parameters()) / chips
    memory = report["program"]["memory"]
    assert state <= memory["arguments"] < state * 1.2 + 2**20
    assert memory["temporaries"] > 0 and memory["total"] < report["chip_hbm"]
    assert report["flops_ratio"] == pytest.approx(RECOMPUTE, rel=0.2)
    assert report["estimated_step_seconds"] > 0 and 0 < report["estimated_mfu"] < 1
    if chips > 1:
        assert {"all-gather", "reduce-scatter"} <= set(report["program"]["collectives"])
    else:
        assert not {"all-gather", "reduce-scatter"} & set(report["program"]["collectives"])  # nothing to share


def test_moments_in_host_memory_leave_the_chip_only_the_parameters_as_arguments(tmp_path) -> None:
    """``train.optimizer_offload``: libtpu compiles the step with the moments in pinned host memory, updated tensor
    by tensor (``streamed_update``'s barriers over host arrays), and they are not among the chip's arguments."""
    recipe = pod_like("llama3_debug")
    recipe = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, optimizer_offload=True))
    report = compile_in_fresh_process(recipe, tmp_path, "--compile-for", "v5e-1")
    assert report["exit"] == 0 and report["fits"]
    model = build_model(recipe.model.family, recipe.model.args(), model_ops(recipe.kernels))
    params = 4 * sum(p.numel() for p in model.parameters())  # fp32, without the two moments
    memory = report["program"]["memory"]
    assert params <= memory["arguments"] < params * 1.2 + 2**20
