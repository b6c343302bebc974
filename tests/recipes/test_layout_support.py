"""The runners' layout table: what each runner trains on which kind of lane, read by the runners and the dry run."""

import pytest

from titanpod.device import LANES, backend_class
from titanpod.graph import TrainConfig
from titanpod.parallel import ParallelConfig, PlanError
from titanpod.recipes.layout_support import RUNNER_SUPPORT, check_layout, layout_problem

RUNNERS = tuple(RUNNER_SUPPORT)


def problem(runner, lane, train=None, **degrees):
    return layout_problem(runner, lane, backend_class(lane), ParallelConfig(**degrees), train or TrainConfig())


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("lane", ["cpu", "cuda", "tpu"])
def test_every_runner_trains_one_process_a_device_with_fsdp(runner, lane):
    assert problem(runner, lane) is None
    assert problem(runner, lane, fsdp=4) is None


def test_pretraining_and_diffusion_run_on_the_single_controller_lane():
    assert problem("pretrain", "xla") is None
    assert problem("diffusion", "xla") is None
    for runner in ("sft", "grpo"):
        message = problem(runner, "xla")
        assert message is not None and "the xla lane drives every device" in message and "--device.lane" in message


def test_pipeline_stages_need_a_runner_and_a_lane_that_build_them():
    assert problem("pretrain", "cpu", pp=2) is None
    for lane in ("xla", "torch_xla"):
        assert "pipeline stages run with the torch executor" in problem("pretrain", lane, pp=2)
    for runner in ("sft", "grpo", "diffusion"):
        assert "set parallel.pp to 1" in problem(runner, "cpu", pp=2)


def test_split_sequences_are_refused_where_a_runner_needs_whole_rows():
    assert problem("pretrain", "cpu", cp=2) is None
    assert problem("sft", "cpu", cp=2) is None
    for runner in ("grpo", "diffusion"):
        assert "set parallel.cp to 1" in problem(runner, "cpu", cp=2)


def test_every_runner_takes_every_step_mode():
    for runner in RUNNERS:
        for mode in ("eager", "per_block", "whole_step"):
            assert problem(runner, "cpu", TrainConfig(step_mode=mode)) is None


def test_check_layout_raises_the_problem_as_a_plan_error():
    with pytest.raises(PlanError, match="GRPO does not split sequences"):
        check_layout("grpo", "cpu", backend_class("cpu"), ParallelConfig(cp=2), TrainConfig())


def test_the_table_reads_traits_for_every_lane():
    for lane in LANES:
        traits = backend_class(lane)
        assert isinstance(traits.single_controller, bool) and isinstance(traits.supports_pipeline, bool)


def test_the_dry_run_refuses_what_the_runner_would_refuse():
    from titanpod.device import chip_by_name
    from titanpod.recipes import get_recipe
    from titanpod.recipes.planner.plan import plan_run, with_changes

    pipelined_on_xla = with_changes(get_recipe("llama3_debug"), parallel={"pp": 2}, device={"lane": "xla"})
    with pytest.raises(PlanError, match="pipeline stages run with the torch executor"):
        plan_run(pipelined_on_xla, chip_by_name("v5p"), 4, 0.5)
    assert plan_run(with_changes(pipelined_on_xla, device={"lane": "tpu"}), chip_by_name("v5p"), 4, 0.5).fits
