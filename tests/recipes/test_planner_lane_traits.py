"""The dry run plans a lane by its backend class's traits, never its name: a lane registered under another name
with the xla lane's traits gets the xla lane's figures, and one with the tpu lane's the tpu lane's."""

from __future__ import annotations

import dataclasses

import pytest

from titanpod.device import LANE_REGISTRY, chip_by_name
from titanpod.device.backends.cpu import CpuBackend
from titanpod.recipes import get_recipe
from titanpod.recipes.diffusion.registry import get_diffusion_recipe
from titanpod.recipes.families import get_flavor
from titanpod.recipes.planner import RunPlan, plan_run
from titanpod.recipes.planner.flux import FluxRunPlan, plan_flux
from titanpod.recipes.planner.lane_traits import runs_one_jitted_program
from titanpod.recipes.planner.plan import with_changes


class OneControllerStandIn(CpuBackend):
    """A lane defined by a test with the traits the planner reads set as the xla lane's, on an unrelated class."""

    lane = "one_controller_stand_in"
    single_controller = True
    supports_pipeline = False
    device_memory_is_host = False


class ProcessPerDeviceStandIn(CpuBackend):
    """A lane defined by a test with the traits the planner reads set as the tpu lane's."""

    lane = "process_per_device_stand_in"
    device_memory_is_host = False


STAND_INS = {"xla": OneControllerStandIn, "tpu": ProcessPerDeviceStandIn}
"""Each shipped lane, and the stand-in that shares its traits under another name."""


@pytest.fixture
def stand_in_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-ins registered where the planner looks lanes up, for this test only."""
    for backend in STAND_INS.values():
        monkeypatch.setitem(LANE_REGISTRY.entries, backend.lane, backend)


def _as_lane(plan: RunPlan | FluxRunPlan, lane: str) -> RunPlan | FluxRunPlan:
    """``plan`` with the lane it names (in its host memory) replaced by ``lane``: every figure left as it is."""
    return plan if plan.host is None else dataclasses.replace(plan, host=dataclasses.replace(plan.host, lane=lane))


UNSHARDED_BF16 = {"precision": "bf16", "step_mode": "whole_step"}
"""A bf16 step with nothing gathered (``parallel.fsdp`` 1): the jitted step keeps bf16 weight copies."""

PRETRAIN_CASES = {
    "sequence parallelism over tp 8": ("llama3_405b", {}, "v5p", 512),
    "whole vocabulary gradients over ep": ("qwen3_235b_a22b", {}, "v5p", 128),
    "bf16 weight copies, recomputed": (
        "qwen3_debug",
        {"train": {**UNSHARDED_BF16, "memory_policy": "recompute"}, "parallel": {"fsdp": 1}},
        "v5e",
        1,
    ),
    "fp32 matmul outputs kept": (
        "qwen3_debug",
        {"train": {**UNSHARDED_BF16, "memory_policy": "save"}, "parallel": {"fsdp": 1}},
        "v5e",
        1,
    ),
}
"""Recipes whose plans differ between the xla and tpu lanes, one for each figure the jitted step changes."""


@pytest.mark.usefixtures("stand_in_lanes")
@pytest.mark.parametrize("case", PRETRAIN_CASES)
@pytest.mark.parametrize("shipped", STAND_INS)
def test_a_lane_with_a_shipped_lanes_traits_gets_its_pretraining_plan(case: str, shipped: str) -> None:
    name, changes, chip, chips = PRETRAIN_CASES[case]
    recipe = with_changes(get_recipe(name), **changes)
    stand_in = STAND_INS[shipped].lane
    expected = plan_run(with_changes(recipe, device={"lane": shipped}), chip_by_name(chip), chips, 0.4)
    planned = plan_run(with_changes(recipe, device={"lane": stand_in}), chip_by_name(chip), chips, 0.4)
    assert _as_lane(planned, shipped) == expected
    other = "tpu" if shipped == "xla" else "xla"
    assert plan_run(with_changes(recipe, device={"lane": other}), chip_by_name(chip), chips, 0.4) != expected


@pytest.mark.usefixtures("stand_in_lanes")
@pytest.mark.parametrize("shipped", STAND_INS)
def test_a_lane_with_a_shipped_lanes_traits_gets_its_flux_plan(shipped: str) -> None:
    """The reference attention's score matrices, counted where the step is one jitted program."""
    recipe = with_changes(get_diffusion_recipe("flux1_12b"), kernels={"attention": "sdpa"})
    v5p = chip_by_name("v5p")
    expected = plan_flux(with_changes(recipe, device={"lane": shipped}), v5p, 8, 0.4)
    planned = plan_flux(with_changes(recipe, device={"lane": STAND_INS[shipped].lane}), v5p, 8, 0.4)
    assert _as_lane(planned, shipped) == expected


def test_the_jitted_step_is_read_from_the_single_controller_trait_of_the_lanes_class() -> None:
    registry = LANE_REGISTRY.with_lane(OneControllerStandIn).with_lane(ProcessPerDeviceStandIn)
    assert runs_one_jitted_program(OneControllerStandIn.lane, registry)
    assert not runs_one_jitted_program(ProcessPerDeviceStandIn.lane, registry)
    assert [lane for lane in LANE_REGISTRY.names if runs_one_jitted_program(lane)] == ["xla"]


def test_a_jitted_step_of_several_micro_batches_holds_a_second_copy_of_the_gradients():
    """The xla lane's one program keeps the gradients' running sum beside each micro-batch's own; a process per
    device (the cpu lane here) adds each micro-batch's gradients into the same tensors."""
    recipe = get_recipe("llama32_1b")
    chip = chip_by_name("v5e")
    one, two = (plan_run(with_changes(recipe, train={"grad_accum_steps": n}), chip, 1, 0.4) for n in (1, 2))
    assert two.memory.gradients == 2 * one.memory.gradients
    assert two.memory.total - one.memory.total == one.memory.gradients
    eager = with_changes(recipe, device={"lane": "cpu"}, train={"optimizer_offload": False})
    assert plan_run(with_changes(eager, train={"grad_accum_steps": 2}), chip, 1, 0.4).memory.gradients == (
        plan_run(eager, chip, 1, 0.4).memory.gradients
    )


def test_gradients_summed_inside_the_blocks_loop_keep_a_second_copy_only_outside_the_blocks():
    """``train.sum_gradients_in_loop``: the stacked blocks' gradients are summed in place in the loop's backward;
    only the other parameters' (Llama 3.2 1B: the tied embedding and the final norm) keep a second copy."""
    recipe = get_recipe("llama32_1b")
    chip = chip_by_name("v5e")
    one = plan_run(recipe, chip, 1, 0.4)
    summed = plan_run(with_changes(recipe, train={"grad_accum_steps": 8, "sum_gradients_in_loop": True}), chip, 1, 0.4)
    args = get_flavor("llama3", "1B")
    outside_blocks = (args.vocab_size * args.dim + args.dim) * 4  # fp32
    assert summed.memory.gradients == one.memory.gradients + outside_blocks
    assert summed.memory.total < chip.memory_bytes  # two micro-batches without it need more than the chip holds
    with pytest.raises(ValueError, match=r"sum_gradients_in_loop .* --train.scan-layers"):
        with_changes(recipe, train={"sum_gradients_in_loop": True, "scan_layers": False})
