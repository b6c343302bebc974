"""What a pretraining run changes for pipeline stages before it starts: micro-batches, and what it refuses."""

from types import SimpleNamespace

import pytest

from titanpod.parallel import PlanError
from titanpod.recipes import get_recipe
from titanpod.recipes.planner.plan import with_changes
from titanpod.runs.pipelined import check_pipeline_lane, with_pipeline_microbatches


def test_a_pipeline_gets_its_micro_batches_as_the_steps_own():
    debug = get_recipe("llama3_debug")
    assert with_pipeline_microbatches(debug) is debug  # pp 1: unchanged
    pp2 = with_changes(debug, parallel={"pp": 2})
    assert with_pipeline_microbatches(pp2).train.grad_accum_steps == 2  # the fewest 1F1B runs
    chosen = with_changes(debug, parallel={"pp": 2, "pp_microbatches": 6})
    assert with_pipeline_microbatches(chosen).train.grad_accum_steps == 6
    accumulating = with_changes(debug, parallel={"pp": 2}, train={"grad_accum_steps": 4})
    assert with_pipeline_microbatches(accumulating).train.grad_accum_steps == 4


def test_validation_with_pipeline_stages_is_refused_naming_the_setting():
    recipe = with_changes(get_recipe("llama3_debug"), parallel={"pp": 2}, data={"validation_fraction": 0.1})
    with pytest.raises(PlanError, match=r"data\.validation_fraction"):
        with_pipeline_microbatches(recipe)


@pytest.mark.parametrize(("lane", "single_controller"), [("xla", True), ("torch_xla", False)])
def test_lanes_without_pipeline_stages_are_refused(lane, single_controller):
    recipe = with_changes(get_recipe("llama3_debug"), parallel={"pp": 2})
    with pytest.raises(PlanError, match="torch executor"):
        check_pipeline_lane(recipe, SimpleNamespace(lane=lane, single_controller=single_controller))  # type: ignore[arg-type]
    check_pipeline_lane(recipe, SimpleNamespace(lane="cpu", single_controller=False))  # type: ignore[arg-type]
