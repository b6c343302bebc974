"""Sharded creation: a model left on the meta device, sharded by ``parallelize(..., initial_values=...)``,
holds exactly one process's ``init_weights`` of the same seed, bit for bit, and each rank makes only its shard."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_json_script, run_python
from tests.parallel.test_torchrun import free_port

FAKE_RANKS = """
import json
import torch, torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from titanpod.device import get_backend
from titanpod.models import region_initializer
from titanpod.recipes.families import build_model
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan
from titanpod.parallel.torch_executor import local_region, parallelize

layouts = {
    "fsdp4": ("llama3", ParallelConfig(fsdp=4)),
    "fsdp2_tp2": ("llama3", ParallelConfig(fsdp=2, tp=2)),
    "hsdp2_fsdp2": ("llama3", ParallelConfig(dp_replicate=2, fsdp=2)),
    "tp4": ("qwen3", ParallelConfig(fsdp=1, tp=4)),
    "ep2_fsdp2": ("qwen3_moe", ParallelConfig(fsdp=2, ep=2)),
    "ep4": ("qwen3_moe", ParallelConfig(fsdp=1, ep=4)),
}
found = {}
for layout, (family, config) in layouts.items():
    whole = build_model(family, "debug", device="cpu")
    whole.init_weights(3)
    reference = dict(whole.named_parameters())
    for rank in range(4):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        model = build_model(family, "debug")
        values = region_initializer(model, 3)
        sharded = parallelize(model, sharding_plan(family), config, get_backend("cpu"), initial_values=values)
        wrong, local, full = [], 0, 0
        for name, param in model.named_parameters():
            assert isinstance(param, DTensor) and param.to_local().device.type == "cpu", name
            # sharded.mesh, not param.device_mesh: DTensor's spec cache may hand back an equal mesh made
            # under an earlier (fake) rank, whose coordinate is stale
            region = local_region(param.shape, sharded.mesh, param.placements)
            if not torch.equal(param.to_local(), reference[name][region]):
                wrong.append(name)
            local += param.to_local().numel()
            full += param.numel()
        found[f"{layout}/{rank}"] = {"wrong": wrong, "share": local / full}
        dist.destroy_process_group()
print(json.dumps(found))
"""


def test_every_rank_creates_exactly_its_shard_of_the_one_process_init():
    """Six layouts, every rank of 4 (on a fake process group): each local shard equals the whole
    one-process init at that rank's region, bit for bit, and holds about 1/4 of the model (less
    replication: per-head norms stay whole, and dp_replicate and tp-whole parameters repeat)."""
    found = run_json_script(FAKE_RANKS, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert len(found) == 24
    for key, result in found.items():
        assert result["wrong"] == [], key
    for rank in range(4):
        assert found[f"fsdp4/{rank}"]["share"] == pytest.approx(0.25, abs=0.005)
        assert found[f"ep4/{rank}"]["share"] < 0.45  # attention and embeddings are also split over ep
        assert found[f"hsdp2_fsdp2/{rank}"]["share"] == pytest.approx(0.5, abs=0.01)


META_WITHOUT_VALUES = """
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from titanpod.device import get_backend
from titanpod.recipes.families import build_model
from titanpod.parallel import ParallelConfig, PlanError
from titanpod.recipes.families import sharding_plan
from titanpod.parallel.torch_executor import parallelize

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
try:
    parallelize(build_model("llama3", "debug"), sharding_plan("llama3"), ParallelConfig(fsdp=2), get_backend("cpu"))
except PlanError as error:
    print(error)
"""


def test_a_meta_model_without_initial_values_is_refused_with_the_fix():
    result = run_python(META_WITHOUT_VALUES, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "on the meta device (e.g. tok_embeddings.weight)" in result.stdout
    assert "region_initializer(model, seed)" in result.stdout


@pytest.mark.slow
def test_sharded_creation_under_torchrun_gathers_to_the_one_process_init(tmp_path):
    """FSDP=4, FSDP2 x TP2 (llama3) and EP2 x FSDP2 (qwen3_moe) on 4 gloo processes, one launch:
    every parameter, gathered whole, equals one process's init of the same seed bit for bit, and each
    rank holds exactly the elements the plan gives it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("sharded_init_worker.py")
    out = tmp_path / "result.json"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())]  # fmt: skip
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*launcher, str(worker), "--out", str(out)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-8000:]
    ranks = json.loads(out.read_text())
    assert len(ranks) == 4
    for rank, layouts in enumerate(ranks):
        assert sorted(layouts) == ["ep2_fsdp2", "fsdp2_tp2", "fsdp4"]
        for layout, found in layouts.items():
            assert found["mismatched"] == [], (rank, layout)
            assert found["local_numel"] == found["expected_local_numel"], (rank, layout)
            assert found["devices"] == ["cpu"], (rank, layout)
