"""The dry-run planner with pipeline stages: each device holds its stage's share, and the activations in flight."""

import pytest

from titanpod.device import chip_by_name
from titanpod.parallel import ParallelConfig, PlanError
from titanpod.parallel.torch_executor import pipeline_layout
from titanpod.recipes import get_recipe
from titanpod.recipes.planner import plan_run
from titanpod.recipes.planner.pipeline_bubble import pipeline_bubble
from titanpod.recipes.planner.pipeline_memory import in_flight_forwards
from titanpod.recipes.planner.plan import with_changes
from titanpod.recipes.planner.report import suggestions


def test_1f1b_keeps_pp_minus_rank_micro_batches_in_flight():
    layout = pipeline_layout(ParallelConfig(pp=4), grad_accum_steps=8)
    assert [in_flight_forwards(layout, rank) for rank in range(4)] == [4, 3, 2, 1]
    assert in_flight_forwards(pipeline_layout(ParallelConfig(pp=4), 4), 0) == 4


def test_interleaved_keeps_its_warm_up_forwards_in_flight():
    # torch's ScheduleInterleaved1F1B: (stages a rank - 1) x micro-batches a round + 2 (pp - 1 - rank) warm-up forwards
    layout = pipeline_layout(ParallelConfig(pp=4, pp_schedule="interleaved_1f1b"), grad_accum_steps=8)
    assert [in_flight_forwards(layout, rank) for rank in (0, 3)] == [4 + 6 + 1, 4 + 0 + 1]


def test_pipeline_stages_halve_the_state_per_device_and_keep_the_model_in_flight():
    chip = chip_by_name("v5p")
    pp = get_recipe("llama3_405b_pp")
    flat = with_changes(pp, parallel={"pp": 1}, train={"grad_accum_steps": 1})
    plan_pp, plan_flat = plan_run(pp, chip, 1024, 0.4), plan_run(flat, chip, 512, 0.4)
    assert plan_pp.mesh == {**plan_flat.mesh, "pp": 2}
    # the same fsdp x tp sub-mesh holds half the layers; the embedding on the first stage weighs as the head
    assert plan_pp.memory.parameters == pytest.approx(plan_flat.memory.parameters / 2, rel=1e-3)
    # 1F1B: the first rank keeps pp micro-batches of its half of the layers, as many as one micro-batch of all
    no_recompute = with_changes(pp, parallel={"pp_recompute": False})
    flat_save = with_changes(flat, train={"memory_policy": "save"})
    first = plan_run(no_recompute, chip, 1024, 0.4).memory.activations
    whole = plan_run(flat_save, chip, 512, 0.4).memory.activations
    assert first < whole < first * 1.1  # the head's activations count on the last rank only
    assert plan_pp.memory_policy == "recompute" and plan_pp.fits


def test_a_pipeline_the_model_cannot_take_is_refused_by_the_planner():
    recipe = get_recipe("llama3_405b_pp")
    with pytest.raises(PlanError, match="do not divide"):
        plan_run(with_changes(recipe, parallel={"pp": 4}, target={"chips": 2048}), chip_by_name("v5p"), 2048, 0.4)
    with pytest.raises(PlanError, match="grad_accum_steps"):
        plan_run(with_changes(recipe, train={"grad_accum_steps": 4}), chip_by_name("v5p"), 1024, 0.4)


def test_the_step_time_counts_the_pipelines_idle_warm_up_and_drain():
    assert pipeline_bubble(pipeline_layout(ParallelConfig(pp=2), 8)) == pytest.approx(1 / 9)
    interleaved = ParallelConfig(pp=4, pp_schedule="interleaved_1f1b", pp_stages_per_rank=2)
    assert pipeline_bubble(pipeline_layout(interleaved, 8)) == pytest.approx(3 / 19)
    chip = chip_by_name("v5p")
    plan = plan_run(get_recipe("llama3_405b_pp"), chip, 1024, 0.4)
    working = plan.flops_per_token * plan.tokens_per_step / (plan.devices * chip.peak_flops * 0.4)
    assert plan.step_seconds == pytest.approx(working * 9 / 8)
    assert plan.pipeline.startswith("1f1b")


def test_a_pipeline_that_does_not_fit_is_advised_its_own_recompute():
    recipe = with_changes(get_recipe("llama3_405b_pp"), parallel={"pp_recompute": False})
    found = suggestions(recipe, chip_by_name("v5p"), 1024, 0.4)
    assert found[0].flags == "--parallel.pp-recompute" and found[0].plan.fits
    assert not any("whole_step" in suggestion.flags for suggestion in found)  # a pipeline step runs eager
