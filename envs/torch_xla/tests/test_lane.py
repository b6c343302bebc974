"""The torch_xla lane trains the debug recipes as the cpu lane does: eager (lazy tensors, one XLA program per
step), the whole step through ``torch.compile(backend="openxla")``, SPMD over four host devices from the
family's sharding plan, and resume from a checkpoint. fp32 losses within 1e-5 relative of the cpu lane's."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SMALL, assert_close, losses, train


@pytest.mark.parametrize("recipe", ["llama3_debug", "qwen3_debug"])
@pytest.mark.parametrize("mode", ["eager", "whole_step"])
def test_trains_like_the_cpu_lane(runs: Path, cpu_reference, recipe: str, mode: str) -> None:
    name = f"xla-{recipe}-{mode}"
    done = train(runs, name, "--recipe", recipe, "--device.lane", "torch_xla", "--train.step-mode", mode, *SMALL)
    assert "lane torch_xla on xla:0" in done.stdout
    assert_close(losses(runs, name), cpu_reference(recipe))


def test_spmd_over_four_host_devices(runs: Path, cpu_reference) -> None:
    name = "xla-spmd-fsdp4"
    # one process drives four data ranks and loads each one's batch: 4 x 1 rows, the cpu run's 4 rows per step
    per_rank = [*SMALL]
    per_rank[per_rank.index("--data.batch-size") + 1] = "1"
    done = train(runs, name, "--device.lane", "torch_xla", "--parallel.fsdp", "4", *per_rank, devices=4)
    assert "lane torch_xla" in done.stdout
    assert '"fsdp": 4' in (runs / name / "recipe.json").read_text()
    assert_close(losses(runs, name), cpu_reference("llama3_debug"))


def test_resumes_where_it_stopped(runs: Path, cpu_reference) -> None:
    common = ["--device.lane", "torch_xla", "--checkpoint.every", "5", *SMALL]
    train(runs, "xla-resumed", *common, "--train.stop-at-step", "5")
    assert (runs / "xla-resumed" / "checkpoints" / "step-000005" / "trainer.json").is_file()
    done = train(runs, "xla-resumed", *common, "--resume")
    assert "resum" in done.stdout.lower()
    resumed = losses(runs, "xla-resumed")
    assert_close(resumed, cpu_reference("llama3_debug"))
