"""What a pretraining run changes for pipeline stages before it starts: micro-batches, and what it refuses."""

import pytest

from titanpod.device import backend_class
from titanpod.parallel import PlanError
from titanpod.recipes import get_recipe
from titanpod.recipes.layout_support import check_layout
from titanpod.recipes.planner.plan import with_changes
from titanpod.runs.pipelined import with_pipeline_microbatches


def steps_batch(recipe) -> tuple[int, int, int]:
    """(sequences a step a data rank, micro-batches, sequences a micro-batch) of a recipe as a pipeline runs it."""
    run = with_pipeline_microbatches(recipe)
    return run.data.batch_size * run.train.grad_accum_steps, run.train.grad_accum_steps, run.data.batch_size


def test_pipeline_micro_batches_split_the_steps_batch_and_never_grow_it():
    debug = with_changes(get_recipe("llama3_debug"), data={"batch_size": 8})
    assert with_pipeline_microbatches(debug) is debug  # pp 1: unchanged
    assert steps_batch(with_changes(debug, parallel={"pp": 2})) == (8, 2, 4)  # the fewest 1F1B runs
    assert steps_batch(with_changes(debug, parallel={"pp": 2, "pp_microbatches": 8})) == (8, 8, 1)
    assert steps_batch(with_changes(debug, parallel={"pp": 4})) == (8, 4, 2)
    accumulating = with_changes(debug, parallel={"pp": 2}, train={"grad_accum_steps": 4})
    assert steps_batch(accumulating) == (32, 4, 8)  # accumulation multiplies the batch, with or without stages
    pod = get_recipe("llama3_405b_pp")  # 1 sequence x 8 accumulated, in 8 micro-batches: as the recipe says
    assert steps_batch(pod) == (8, 8, 1)


def test_micro_batches_that_do_not_divide_the_batch_are_refused_naming_the_fields():
    recipe = with_changes(get_recipe("llama3_debug"), data={"batch_size": 8}, parallel={"pp": 2, "pp_microbatches": 3})
    with pytest.raises(PlanError, match=r"8 sequence\(s\) a data rank .* into 3 pipeline micro-batches"):
        with_pipeline_microbatches(recipe)


def test_validation_with_pipeline_stages_is_refused_naming_the_setting():
    recipe = with_changes(get_recipe("llama3_debug"), parallel={"pp": 2}, data={"validation_fraction": 0.1})
    with pytest.raises(PlanError, match=r"data\.validation_fraction"):
        with_pipeline_microbatches(recipe)


@pytest.mark.parametrize("lane", ["xla", "torch_xla"])
def test_lanes_without_pipeline_stages_are_refused(lane):
    recipe = with_changes(get_recipe("llama3_debug"), parallel={"pp": 2})
    with pytest.raises(PlanError, match="torch executor"):
        check_layout("pretrain", lane, backend_class(lane), recipe.parallel, recipe.train)
    check_layout("pretrain", "cpu", backend_class("cpu"), recipe.parallel, recipe.train)
