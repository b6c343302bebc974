"""A run checks its plan against the device it is on (or the host's memory) before building anything.

The backend here stands in for the xla lane on one TPU v5e chip as JAX reported it on 2026-12-05 (a
'TPU v5 lite', 16,909,336,064 bytes); the planner's figures are those the dry run prints. Qwen 3 0.6B at
4 x 4,096 tokens recomputed ran there (12.9 GiB); ``selective`` needed 31.8 GiB of temporaries.
"""

from __future__ import annotations

import pytest

from titanpod.device import chip_by_name
from titanpod.device.memory import MemoryStats
from titanpod.pretrain.command import parse_command
from titanpod.runs.device_fit import RecipeDoesNotFitDevice, check_recipe_fits_device

V5E_BYTES = 16909336064


class OneChip:
    """The parts of a backend the check reads: one v5e chip that reports its memory."""

    lane = "xla"
    single_controller = True

    def __init__(self, kind: str = "device") -> None:
        self.kind = kind

    def memory_stats(self, local_rank: int = 0) -> MemoryStats:
        return MemoryStats(0, 0, V5E_BYTES, self.kind)

    def chip(self):
        return chip_by_name("TPU v5 lite")

    def device_count(self) -> int:
        return 1


def qwen3_06b(*flags: str):
    base = ["--recipe", "qwen3_8b", "--model.flavor", "0.6B", "--parallel.fsdp", "1", "--data.seq-len", "4096"]
    return parse_command([*base, *flags]).recipe


def test_a_recipe_that_ran_on_the_chip_is_let_through_with_its_plan():
    plan = check_recipe_fits_device(qwen3_06b("--data.batch-size", "4"), OneChip())  # type: ignore[arg-type]
    assert plan is not None and plan.chips == 1 and plan.memory.total < V5E_BYTES


def test_selective_at_4_by_4096_is_refused_before_anything_is_built_naming_a_change_that_fits():
    recipe = qwen3_06b("--data.batch-size", "4", "--train.memory-policy", "selective")
    with pytest.raises(RecipeDoesNotFitDevice) as refused:
        check_recipe_fits_device(recipe, OneChip())  # type: ignore[arg-type]
    message = str(refused.value)
    assert "as planned on 1 x v5e" in message and "this device holds 15.75 GiB" in message
    assert "Nothing was built" in message and "--train.memory-policy recompute" in message


def test_a_chip_that_reports_no_use_is_checked_against_its_chips_memory():
    """torch_tpu on libtpu 0.0.42.1 reports no memory use; the chip's capacity is still its table's."""
    recipe = qwen3_06b("--data.batch-size", "4", "--train.memory-policy", "selective")
    with pytest.raises(RecipeDoesNotFitDevice, match=r"this device holds 15\.75 GiB"):
        check_recipe_fits_device(recipe, OneChip(kind="unavailable"))  # type: ignore[arg-type]


def test_the_host_is_checked_against_its_memory_shared_by_the_jobs_processes_on_it(monkeypatch):
    recipe = qwen3_06b("--data.batch-size", "4", "--train.memory-policy", "selective")
    with pytest.raises(RecipeDoesNotFitDevice, match=r"this machine's memory holds 15\.75 GiB"):
        check_recipe_fits_device(recipe, OneChip(kind="host"))  # type: ignore[arg-type]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    fits_alone = qwen3_06b("--data.batch-size", "1")
    with pytest.raises(RecipeDoesNotFitDevice, match=r"this machine's memory \(a share of 2 processes\) holds 7.87"):
        check_recipe_fits_device(fits_alone, OneChip(kind="host"))  # type: ignore[arg-type]


def test_nothing_is_checked_where_no_capacity_is_known():
    class Unknown(OneChip):
        def memory_stats(self, local_rank: int = 0) -> MemoryStats:
            return MemoryStats(None, None, None, "unavailable", "no figures")

    recipe = qwen3_06b("--data.batch-size", "4", "--train.memory-policy", "selective")
    assert check_recipe_fits_device(recipe, Unknown()) is None  # type: ignore[arg-type]


def test_a_batch_the_host_cannot_hold_is_refused_before_step_1(tmp_path, capsys):
    from titanpod.pretrain.cli import main

    argv = ["--device.lane", "cpu", "--data.batch-size", "4096", "--train.steps", "1", "--output.runs-dir",
            str(tmp_path), "--output.run-name", "big", "--output.no-tensorboard"]  # fmt: skip
    assert main(argv) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert "this machine's memory holds" in said and "Nothing was built" in said
    assert not (tmp_path / "big" / "metrics.jsonl").exists()
