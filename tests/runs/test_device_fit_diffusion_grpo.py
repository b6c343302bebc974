"""FLUX and GRPO runs on an accelerator check their plans against the device before building anything, as
pretraining does (tests/runs/test_device_fit.py): the refusal names what the plan holds and each change whose
plan fits, and lists no change whose plan does not."""

from __future__ import annotations

import pytest

from tests.rl.test_grpo_run import tiny
from tests.rl.tiny_policy import write_tiny_policy
from tests.runs.test_device_fit import V5E_BYTES, OneChip
from titanpod.device.backends.cpu import CpuBackend
from titanpod.device.memory import MemoryStats
from titanpod.recipes.diffusion.registry import get_diffusion_recipe
from titanpod.recipes.families.catalog import get_flavor
from titanpod.recipes.planner.flux import plan_flux
from titanpod.recipes.planner.grpo import plan_grpo
from titanpod.recipes.planner.plan import with_changes
from titanpod.recipes.posttrain.registry import grpo_debug
from titanpod.runs.device_fit import RecipeDoesNotFitDevice, check_diffusion_fits_device, check_grpo_fits_device

GIB = 1024**3


class OneTpuProcess(OneChip):
    """One v5e chip driven by one process (the tpu lane), as a GRPO run has it."""

    lane = "tpu"
    single_controller = False


def changed(recipe, section: str, **values):
    return with_changes(recipe, **{section: values})


def flux_debug(batch: int):
    recipe = get_diffusion_recipe("flux_debug")
    return changed(changed(recipe, "data", batch_size=batch), "train", step_mode="whole_step")


def flux_bytes(recipe) -> int:
    return plan_flux(recipe, OneChip().chip(), 1, recipe.target.mfu).total_bytes


def test_a_flux_batch_that_fits_the_chip_passes_with_its_planned_bytes():
    recipe = flux_debug(32)
    assert check_diffusion_fits_device(recipe, OneChip()) == flux_bytes(changed(recipe, "device", lane="xla"))


def test_a_flux_batch_too_large_for_the_chip_is_refused_naming_the_changes_that_fit():
    recipe = flux_debug(16384)
    assert flux_bytes(recipe) > V5E_BYTES
    with pytest.raises(RecipeDoesNotFitDevice) as refused:
        check_diffusion_fits_device(recipe, OneChip())  # type: ignore[arg-type]
    message = str(refused.value)
    assert "as planned on 1 x v5e" in message and "frozen encoders" in message and "Nothing was built" in message
    assert flux_bytes(changed(recipe, "train", memory_policy="recompute")) <= V5E_BYTES
    assert flux_bytes(changed(recipe, "data", batch_size=8192)) <= V5E_BYTES
    assert "--train.memory-policy recompute" in message and "--data.batch-size 8192" in message


def grpo_qwen3_06b(**train):
    recipe = grpo_debug()
    recipe = changed(recipe, "grpo", prompts_per_step=1, group_size=8)
    return changed(recipe, "train", **train) if train else recipe


def grpo_bytes(recipe) -> int:
    return plan_grpo(recipe, "qwen3", get_flavor("qwen3", "0.6B"), 1, 256).total


def test_a_grpo_run_too_large_for_the_chip_is_refused_with_its_engine_and_only_the_changes_that_fit():
    recipe = grpo_qwen3_06b()
    assert grpo_bytes(recipe) > V5E_BYTES
    with pytest.raises(RecipeDoesNotFitDevice) as refused:
        check_grpo_fits_device(recipe, "qwen3", get_flavor("qwen3", "0.6B"), OneTpuProcess(), 256)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "rollout engine" in message and "KL reference" in message and "this device holds 15.75 GiB" in message
    candidates = {
        "--train.step-mode whole_step --train.memory-policy recompute": grpo_qwen3_06b(
            step_mode="whole_step", memory_policy="recompute"
        ),
        "--train.grad-accum-steps 2": grpo_qwen3_06b(grad_accum_steps=2),
    }
    for flags, candidate in candidates.items():
        assert (flags in message) == (grpo_bytes(candidate) <= V5E_BYTES), (flags, message)
    assert "--grpo.prompts-per-step" not in message  # one prompt cannot be halved


def test_a_grpo_run_on_a_chip_whose_runtime_reports_no_memory_use_is_still_checked():
    """torch_tpu on libtpu 0.0.42.1 reports no memory use: such a run of 128 rows once ran out of a v5e mid-step."""
    recipe = grpo_qwen3_06b()
    with pytest.raises(RecipeDoesNotFitDevice, match=r"this device holds 15\.75 GiB"):
        check_grpo_fits_device(recipe, "qwen3", get_flavor("qwen3", "0.6B"), OneTpuProcess(kind="unavailable"), 256)  # type: ignore[arg-type]


def test_a_grpo_run_that_fits_passes_with_its_planned_bytes():
    recipe = grpo_qwen3_06b()
    small = get_flavor("qwen3", "0.6B")
    assert (
        check_grpo_fits_device(recipe, "qwen3", small, OneTpuProcess(), 32)
        == plan_grpo(recipe, "qwen3", small, 1, 32).total
    )


@pytest.fixture
def a_tiny_cpu_device(monkeypatch):
    """The cpu lane made to report a device of 1 MiB, so a run's check refuses before it builds anything."""
    monkeypatch.setattr(CpuBackend, "memory_stats", lambda self, local_rank=0: MemoryStats(0, 0, 2**20, "device"))


def test_a_diffusion_run_checks_its_plan_before_it_builds_anything(a_tiny_cpu_device, tmp_path):
    from titanpod.runs.diffusion.run import run_diffusion

    recipe = changed(get_diffusion_recipe("flux_debug"), "device", lane="cpu")
    recipe = changed(recipe, "output", runs_dir=str(tmp_path), run_name="refused")
    with pytest.raises(RecipeDoesNotFitDevice, match="Nothing was built"):
        run_diffusion(recipe)
    assert not (tmp_path / "refused").exists()


def test_a_grpo_run_checks_its_plan_before_it_reads_the_policy(a_tiny_cpu_device, tmp_path):
    from titanpod.rl.grpo.run import run_grpo

    folder = write_tiny_policy(tmp_path / "sft" / "model")
    with pytest.raises(RecipeDoesNotFitDevice, match="rollout engine"):
        run_grpo(tiny(tmp_path, folder, "refused"))
    assert not (tmp_path / "refused").exists()


def test_a_run_from_a_checkpoint_is_planned_at_the_checkpoints_shape_not_the_recipe_flavors():
    from titanpod.pretrain.command import parse_command
    from titanpod.runs.device_fit import check_recipe_fits_device

    recipe = parse_command(["--recipe", "llama3_debug"]).recipe
    assert check_recipe_fits_device(recipe, OneChip()) is not None  # type: ignore[arg-type]
    with pytest.raises(RecipeDoesNotFitDevice, match=r"llama3_debug needs .* Nothing was built"):
        check_recipe_fits_device(recipe, OneChip(), get_flavor("llama3", "8B"))  # type: ignore[arg-type]


def test_a_fine_tuning_run_is_planned_at_its_models_shape():
    from titanpod.recipes.posttrain.registry import get_posttrain_recipe
    from titanpod.runs.device_fit import check_sft_fits_device

    recipe = get_posttrain_recipe("sft_debug").build()
    plan = check_sft_fits_device(recipe, OneChip(), recipe.model.args())  # type: ignore[arg-type]
    assert plan is not None and plan.seq_len == recipe.data.seq_len
    with pytest.raises(RecipeDoesNotFitDevice, match="Nothing was built"):
        check_sft_fits_device(recipe, OneChip(), get_flavor("qwen3", "8B"))  # type: ignore[arg-type]


def test_a_fine_tuning_run_checks_its_plan_before_it_builds_anything(a_tiny_cpu_device, tmp_path):
    from titanpod.recipes.posttrain.registry import get_posttrain_recipe
    from titanpod.runs.sft import run_sft

    recipe = get_posttrain_recipe("sft_debug").build()
    recipe = changed(changed(recipe, "device", lane="cpu"), "output", runs_dir=str(tmp_path), run_name="refused")
    with pytest.raises(RecipeDoesNotFitDevice, match="Nothing was built"):
        run_sft(recipe)
    assert not (tmp_path / "refused").exists()
