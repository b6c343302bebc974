"""The family's sharding plan, applied through torch_xla SPMD, lays every parameter and batch out as the plan says."""

from __future__ import annotations

import os
import subprocess
import sys

LAYOUT = """
import json
import torch, torch_xla, torch_xla.runtime as xr
from titanpod.device import get_backend
from titanpod.recipes.families import build_model, get_flavor, sharding_plan
from titanpod.parallel.mesh_dims import param_mesh_dims
from titanpod.parallel.torch_xla_executor import shard_batch, shard_parameters, spmd_mesh

backend = get_backend("torch_xla")
axes = {"fsdp": 2, "tp": 2}
mesh = spmd_mesh(axes)
backend.use_spmd(lambda tensor: shard_batch(tensor, mesh, axes))
model = build_model("llama3", get_flavor("llama3", "debug"))
model.to_empty(device=backend.device())
model.init_weights(0)
shard_parameters(model, sharding_plan("llama3"), mesh, axes)
specs = {name: torch_xla._XLAC._get_xla_sharding_spec(p) for name, p in model.named_parameters()}
dims = {name: param_mesh_dims(sharding_plan("llama3"), name, p.ndim, axes) for name, p in model.named_parameters()}
batch = backend.place_batch(torch.zeros(8, 16, dtype=torch.long))
print(json.dumps({"devices": xr.global_runtime_device_count(), "in_job": backend.devices_in_job(1),
                  "specs": specs, "dims": dims, "batch": torch_xla._XLAC._get_xla_sharding_spec(batch)}))
"""


def test_parameters_and_batches_follow_the_plan() -> None:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = subprocess.run([sys.executable, "-c", LAYOUT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    layout = json.loads(done.stdout.strip().splitlines()[-1])
    assert layout["devices"] == 4 and layout["in_job"] == 4
    for name, dims in layout["dims"].items():
        spec = layout["specs"][name]
        if all(entry is None for entry in dims):
            assert spec in ("", "{replicated}"), f"{name} should be whole on every device: {spec}"
            continue
        split = [2 if entry is not None else 1 for entry in dims]  # each named axis has 2 devices here
        tiles = ",".join(map(str, split))
        assert spec.startswith(f"{{devices=[{tiles}"), f"{name}: plan {dims}, torch_xla {spec}"
    assert layout["batch"].startswith("{devices=[2,1"), layout["batch"]  # rows over the data axis (fsdp)
    sharded = [name for name, dims in layout["dims"].items() if any(dims)]
    assert any("attention" in name for name in sharded) and any("feed_forward" in name for name in sharded)
