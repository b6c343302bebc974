"""Orbax checkpoints of the xla lane's state, and DCP <-> Orbax conversion, are exact.

The jax work runs in one subprocess with 8 host devices (importing torchax in the pytest
process would break torch.compile for the other tests): it trains the llama3 debug model
on the xla lane (fsdp=4 x tp=2) for 2 steps, saves the step's state with Orbax, restores
it into a fresh step, and takes one more step from both; then it converts a DCP state
(bf16 parameters, fp32 moments, RNG bytes) to Orbax and back, and the xla step's Orbax
state to DCP and back. Every comparison is bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.conftest import XLA_ENV, run_json_script
from titanpod.checkpoint.orbax_state import (
    NotACheckpointError,
    dcp_to_orbax,
    load_dcp_state,
    orbax_to_dcp,
    restore_orbax_state,
)

SCRIPT = """
import json, sys, tempfile, time
from pathlib import Path
start = time.perf_counter()
import titanpod.checkpoint.orbax_state as orbax_state
result = {"jax_loaded_by_import": "jax" in sys.modules}

import numpy as np, torch, torch.distributed.checkpoint as dcp
from titanpod.checkpoint.dcp_reader import tensor_shapes
from titanpod.device import get_backend
from titanpod.graph import TrainConfig
from titanpod.graph.xla import XlaStep
from titanpod.recipes.families import build_model
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan

root = Path(tempfile.mkdtemp())

def flat(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        out.update(flat(value, prefix + key + "/") if isinstance(value, dict) else {prefix + key: value})
    return out

def bits(array):  # the raw bytes of a jax array, numpy array or torch tensor
    if isinstance(array, torch.Tensor):
        return array.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return np.asarray(array).tobytes()

def same_trees(a, b):  # keys, dtypes, shapes and bytes all equal
    a, b = flat(a), flat(b)
    def meta(x):
        return (str(x.dtype).removeprefix("torch."), tuple(x.shape))
    return sorted(a) == sorted(b) and all(meta(a[k]) == meta(b[k]) and bits(a[k]) == bits(b[k]) for k in a)

def debug_model():
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(0)
    return model

# (a) xla step -> Orbax -> fresh xla step
generator = torch.Generator().manual_seed(1)
data = [torch.randint(0, 2048, (8, 33), generator=generator) for _ in range(3)]
batches = [[(d[:, :-1], d[:, 1:])] for d in data]
backend = get_backend("xla")
axes = ParallelConfig(fsdp=4, tp=2).mesh_axes(8)
config = TrainConfig(steps=3, warmup_steps=1, log_every=3, step_mode="whole_step")

def new_step():
    return XlaStep(debug_model(), config, backend, plan=sharding_plan("llama3"), axes=axes)

step = new_step()
for batch in batches[:2]:
    step(batch, 1e-3)
saved = step.state_dict()
orbax_state.save_orbax_state(root / "xla", saved)
fresh = new_step()
restored = orbax_state.restore_orbax_state(root / "xla", like=fresh.state_dict())
fresh.load_state_dict(restored)
loaded = fresh.state_dict()
result["xla_exact"] = same_trees(saved, loaded)
flat_saved, flat_restored, flat_loaded = flat(saved), flat(restored), flat(loaded)
result["xla_shardings_kept"] = all(
    flat_loaded[key].sharding == flat_restored[key].sharding == array.sharding for key, array in flat_saved.items()
)
result["wq_spec"] = str(flat_loaded["model/layers.0.attention.wq.weight"].sharding.spec)
result["optim_step"] = float(loaded["optim"]["step"])
host = orbax_state.restore_orbax_state(root / "xla")
result["host_types"] = sorted({type(array).__name__ for array in flat(host).values()})
result["host_exact"] = same_trees(host, saved)
result["next_loss"] = [float(step(batches[2], 1e-3).loss), float(fresh(batches[2], 1e-3).loss)]
result["next_state_exact"] = same_trees(step.state_dict(), fresh.state_dict())
broken = dict(host, model={**host["model"]})
del broken["model"]["norm.weight"]
broken["model"]["extra.weight"] = np.zeros(3, np.float32)
try:
    fresh.load_state_dict(broken)
except ValueError as error:
    result["missing_error"] = str(error)
wrong = dict(host, model={**host["model"], "norm.weight": np.zeros(7, np.float32)})
try:
    fresh.load_state_dict(wrong)
except ValueError as error:
    result["shape_error"] = str(error)

# (b) DCP -> Orbax -> DCP, bf16 included
model = debug_model().to(torch.bfloat16)
torch.manual_seed(0)
params = dict(model.named_parameters())
dcp_state = {
    "model": {name: p.detach() for name, p in params.items()},
    "optim": {
        "step": torch.tensor(7.0),
        "exp_avg": {name: torch.zeros_like(p, dtype=torch.float32).normal_() for name, p in params.items()},
        "exp_avg_sq": {name: torch.zeros_like(p, dtype=torch.float32).uniform_() for name, p in params.items()},
    },
    "rng": {"torch_cpu": torch.get_rng_state()},
}
# torchax is loaded here: DCP's default writer would try to overlap copies from its device, which has no streams
dcp.save(dcp_state, storage_writer=dcp.FileSystemWriter(root / "dcp", per_thread_copy_ahead=0), no_dist=True)
orbax_state.dcp_to_orbax(root / "dcp", root / "dcp_orbax")
as_orbax = orbax_state.restore_orbax_state(root / "dcp_orbax")
result["dcp_orbax_exact"] = same_trees(dcp_state, as_orbax)
result["orbax_bf16"] = str(as_orbax["model"]["norm.weight"].dtype)
orbax_state.orbax_to_dcp(root / "dcp_orbax", root / "dcp_again")
result["dcp_round_trip_exact"] = same_trees(dcp_state, orbax_state.load_dcp_state(root / "dcp_again"))

# (c) Orbax (the xla step's state) -> DCP -> Orbax
orbax_state.orbax_to_dcp(root / "xla", root / "xla_dcp")
result["xla_dcp_keys"] = "model.layers.0.attention.wq.weight" in tensor_shapes(root / "xla_dcp")
result["xla_dcp_exact"] = same_trees(host, orbax_state.load_dcp_state(root / "xla_dcp"))
orbax_state.dcp_to_orbax(root / "xla_dcp", root / "xla_again")
result["orbax_round_trip_exact"] = same_trees(host, orbax_state.restore_orbax_state(root / "xla_again"))
result["seconds"] = time.perf_counter() - start
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def runs() -> dict:
    return run_json_script(SCRIPT, env=XLA_ENV)


def test_importing_the_orbax_module_does_not_load_jax(runs):
    assert runs["jax_loaded_by_import"] is False


def test_xla_state_restores_bit_exact_with_its_shardings_and_trains_on_identically(runs):
    assert runs["xla_exact"] and runs["xla_shardings_kept"]
    assert runs["wq_spec"] == "P('tp', 'fsdp')"
    assert runs["optim_step"] == 2.0
    assert runs["host_types"] == ["ndarray"] and runs["host_exact"]  # without `like`: host numpy arrays
    first, second = runs["next_loss"]
    assert first == second
    assert runs["next_state_exact"]


def test_load_state_dict_names_a_mismatch(runs):
    assert "norm.weight" in runs["missing_error"] and "extra.weight" in runs["missing_error"]
    assert "model / norm.weight" in runs["shape_error"] and "[7]" in runs["shape_error"]


def test_dcp_to_orbax_and_back_is_bit_exact(runs):
    assert runs["dcp_orbax_exact"] and runs["orbax_bf16"] == "bfloat16"
    assert runs["dcp_round_trip_exact"]


def test_orbax_to_dcp_and_back_is_bit_exact(runs):
    assert runs["xla_dcp_keys"] and runs["xla_dcp_exact"]
    assert runs["orbax_round_trip_exact"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_missing_or_foreign_folders_give_a_clear_error(tmp_path: Path):
    missing = tmp_path / "nowhere"
    for call in (lambda: restore_orbax_state(missing), lambda: orbax_to_dcp(missing, tmp_path / "out")):
        with pytest.raises(NotACheckpointError, match=r"nowhere does not exist.*expected an Orbax checkpoint"):
            call()
    with pytest.raises(NotACheckpointError, match=r"nowhere does not exist.*expected a .*DCP"):
        dcp_to_orbax(missing, tmp_path / "out")
    dcp.save({"model": {"w": torch.zeros(2)}}, checkpoint_id=tmp_path / "dcp", no_dist=True)
    with pytest.raises(NotACheckpointError, match=r"dcp is not an Orbax checkpoint: it has no _METADATA file"):
        restore_orbax_state(tmp_path / "dcp")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotACheckpointError, match=r"empty is not a .*DCP.* checkpoint: it has no .metadata file"):
        load_dcp_state(tmp_path / "empty")
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileExistsError, match=r"empty already exists; an Orbax checkpoint is written to a new folder"):
        dcp_to_orbax(tmp_path / "dcp", tmp_path / "empty")
