"""The one placement every runner uses: checks before any model is built, and where the model goes."""

import pytest

from titanpod.device.backends.cpu import CpuBackend
from titanpod.graph import TrainConfig
from titanpod.parallel import ParallelConfig, PlanError
from titanpod.recipes import get_recipe
from titanpod.recipes.families import build_model, sharding_plan
from titanpod.runs.placement import start_placement


class EightDeviceController(CpuBackend):
    """A backend whose one process drives 8 devices, as the xla lane's does (nothing here touches a device)."""

    lane = "xla"
    single_controller = True
    supports_pipeline = False

    def device_count(self) -> int:
        return 8


def debug_model():
    recipe = get_recipe("llama3_debug")
    return build_model(recipe.model.family, recipe.model.args())


def test_one_process_trains_the_model_as_it_is_on_all_of_the_data():
    model = debug_model()
    placement = start_placement("pretrain", ParallelConfig(), TrainConfig(), CpuBackend(), 64, world_size=1).place(
        model, "llama3"
    )
    assert placement.kind == "one process" and placement.model is model
    assert (placement.data_rank, placement.data_world, placement.batch_size(4)) == (0, 1, 4)
    assert placement.reduce_loss is None and placement.plan is sharding_plan("llama3")
    assert placement.step_options(ParallelConfig())["pipeline"] is None


def test_one_controller_loads_every_data_ranks_batch_and_hands_the_compiler_the_mesh():
    parallel = ParallelConfig(fsdp=4, tp=2)
    layout = start_placement("pretrain", parallel, TrainConfig(), EightDeviceController(), 64, world_size=1)
    placement = layout.place(debug_model(), "llama3", initial_values=None)
    assert placement.kind == "one controller"
    assert placement.xla_axes is not None and placement.xla_axes["fsdp"] == 4 and placement.xla_axes["tp"] == 2
    assert (placement.data_rank, placement.data_world, placement.batch_size(2)) == (0, 1, 8)  # 4 data ranks x 2
    assert placement.step_options(parallel)["axes"] == placement.xla_axes


@pytest.mark.parametrize("runner", ["sft", "grpo"])
def test_post_training_runners_refuse_the_single_controller_lane_before_any_model(runner):
    with pytest.raises(PlanError, match="the xla lane drives every device"):
        start_placement(runner, ParallelConfig(), TrainConfig(), EightDeviceController(), world_size=1)


def test_degrees_without_the_processes_name_the_runners_torchrun_command():
    with pytest.raises(PlanError, match=r"titanpod\.posttrain\.cli"):
        start_placement("sft", ParallelConfig(fsdp=2), TrainConfig(), CpuBackend(), world_size=1)


def test_a_sequence_that_does_not_split_over_cp_is_refused():
    with pytest.raises((PlanError, ValueError), match="cp"):
        start_placement("pretrain", ParallelConfig(cp=4), TrainConfig(), CpuBackend(), seq_len=30, world_size=4)
