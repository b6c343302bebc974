"""No file of a checkpoint can make loading it run code, even with its hashes and commit marker recomputed.

Each test crafts a checkpoint the way an attacker holding the folder could: a payload that creates a marker
file if anything unpickles it, placed where a loader might unpickle it, then ``trainer.json``'s manifest and
``COMMITTED`` rewritten to match (they are unkeyed), so every hash check passes. Each asserts the marker was
not created and, where the checkpoint is refused, that the error names what was refused. The paths: DCP's
``.metadata`` (a restricted unpickler), DCP entries stored as pickled objects (refused: titanpod saves tensors
only), DCP tensor data (torch's weights-only loader), Orbax's files (JSON, msgpack, tensorstore: no pickle),
and ``trainer.json`` (JSON only, checked field by field).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, create_default_local_load_plan

from tests.checkpoint.test_safe_metadata import payloads
from tests.checkpoint.test_trainer_state import recipe
from tests.cli_runs import run_cli
from tests.conftest import XLA_ENV
from tests.faults.crafted_checkpoints import (
    CreatesMarker,
    declare_pickled_entry,
    recommit,
    replace_tensor_bytes,
    replace_trainer_file,
    small_checkpoint,
    torch_saved,
)
from titanpod.checkpoint import CheckpointError, complete_checkpoints, read_trainer_file
from titanpod.checkpoint.dcp_reader import (
    SafeFileSystemReader,
    UnsafeCheckpointError,
    load_metadata_bytes,
    quiet_single_process,
)
from titanpod.checkpoint.step_folders import TRAINER_FILE
from titanpod.checkpoint.trainer_state import trainer_state_dict
from titanpod.runs import run_pretraining

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled", "ignore:Detected pickle protocol")

KEY = "model.first.weight"
"""The entry of the small checkpoint the attacks rewrite (any entry would do)."""
RECIPE = {"name": "faults"}
"""The recipe ``small_checkpoint`` saves with (``kill_worker.build``)."""


def test_a_metadata_file_naming_any_callable_is_refused_and_runs_nothing(tmp_path):
    checkpointer, model, step, folder = small_checkpoint(tmp_path)
    marker, variable = tmp_path / "ran", "TITANPOD_CRAFTED_METADATA_RAN"
    for name, payload in payloads(marker, variable, "titanpod_no_such_module").items():
        (folder / "state" / ".metadata").write_bytes(payload)
        recommit(folder)
        read_trainer_file(folder)  # the hash checks pass: the refusal below is the unpickler's
        with pytest.raises(UnsafeCheckpointError, match="DCP metadata never contains"):
            checkpointer.load(folder, model, step, RECIPE)
        assert not marker.exists(), f"{name} ran"
        assert variable not in os.environ, f"{name} ran"


def test_an_entry_stored_as_a_pickled_object_is_refused_naming_the_key_and_file(tmp_path):
    checkpointer, model, step, folder = small_checkpoint(tmp_path)
    marker = tmp_path / "ran"
    declare_pickled_entry(folder / "state", KEY, torch_saved(CreatesMarker(marker)))
    recommit(folder)
    read_trainer_file(folder)  # the hash checks pass
    with pytest.raises(UnsafeCheckpointError) as refused:
        checkpointer.load(folder, model, step, RECIPE)
    message = str(refused.value)
    assert f"state/.metadata declares '{KEY}' as a pickled Python object" in message
    assert "__1_0.distcp" in message and "resume from a checkpoint titanpod saved" in message
    assert not marker.exists()


def test_the_same_crafted_checkpoint_runs_its_payload_under_dcps_own_reader(tmp_path):
    """The trap is real: DCP's stock reader unpickles the entry and creates the marker, though every hash checks."""
    _, model, step, folder = small_checkpoint(tmp_path)
    marker = tmp_path / "ran"
    declare_pickled_entry(folder / "state", KEY, torch_saved(CreatesMarker(marker)))
    recommit(folder)
    read_trainer_file(folder)
    with quiet_single_process():
        dcp.load(trainer_state_dict(model, step), storage_reader=dcp.FileSystemReader(folder / "state"))
    assert marker.exists()


def test_a_pickled_entry_is_never_read_even_past_the_metadata_check(tmp_path):
    """The second guard: given metadata with a pickled entry anyway, the reader refuses the read itself."""
    folder = small_checkpoint(tmp_path)[3]
    marker = tmp_path / "ran"
    declare_pickled_entry(folder / "state", KEY, torch_saved(CreatesMarker(marker)))
    metadata = load_metadata_bytes((folder / "state" / ".metadata").read_bytes())  # without the entry check
    reader = SafeFileSystemReader(folder / "state")
    reader.set_up_storage_reader(metadata, is_coordinator=True)
    wanted = {KEY: torch.zeros(64, 32)}
    plan = create_default_local_load_plan(wanted, metadata)
    planner = DefaultLoadPlanner()
    planner.set_up_planner(wanted, metadata)
    with pytest.raises(UnsafeCheckpointError, match=f"declares '{KEY}' as a pickled Python object"):
        reader.read_data(plan, planner)
    assert not marker.exists()


@pytest.mark.parametrize("form", ["torch.save", "plain pickle"])
def test_tensor_data_that_is_a_pickle_is_refused_by_the_weights_only_loader(tmp_path, form):
    checkpointer, model, step, folder = small_checkpoint(tmp_path)
    marker = tmp_path / "ran"
    payload = torch_saved(CreatesMarker(marker)) if form == "torch.save" else pickle.dumps(CreatesMarker(marker))
    replace_tensor_bytes(folder / "state", KEY, payload)
    recommit(folder)
    with pytest.raises(UnsafeCheckpointError, match="tensor data that is not a plain tensor: torch's weights-only"):
        checkpointer.load(folder, model, step, RECIPE)
    assert not marker.exists()


def test_tensor_data_kept_outside_the_state_folder_is_refused(tmp_path):
    checkpointer, model, step, folder = small_checkpoint(tmp_path)
    marker = tmp_path / "ran"
    replace_tensor_bytes(folder / "state", KEY, torch_saved(CreatesMarker(marker)), data_file="../elsewhere.distcp")
    recommit(folder)
    with pytest.raises(UnsafeCheckpointError, match=rf"keeps '{KEY}' in '\.\./elsewhere\.distcp', outside the check"):
        checkpointer.load(folder, model, step, RECIPE)
    assert not marker.exists()


def test_resuming_a_run_from_a_crafted_checkpoint_stops_before_training(tmp_path):
    first = run_pretraining(recipe(tmp_path, 3))
    folder = complete_checkpoints(first.run_dir / "checkpoints")[-1][1]
    marker = tmp_path / "ran"
    declare_pickled_entry(folder / "state", "optim.step", torch_saved(CreatesMarker(marker)))
    recommit(folder)
    with pytest.raises(UnsafeCheckpointError, match=r"declares 'optim\.step' as a pickled Python object"):
        run_pretraining(recipe(tmp_path, 5))
    assert not marker.exists()


@pytest.mark.slow
def test_titanpod_pretrain_resume_path_refuses_a_crafted_checkpoint_and_exits_1(tmp_path):
    run = ["--train.steps", "2", "--train.warmup-steps", "1", "--data.seq-len", "32", "--output.no-tensorboard"]
    saved = run_cli("titanpod.pretrain.cli", [*run, "--output.run-name", "saved"], tmp_path)
    assert saved.returncode == 0, saved.stderr[-3000:]
    folder = tmp_path / "runs" / "saved" / "checkpoints" / "step-000002"
    marker = tmp_path / "ran"
    declare_pickled_entry(folder / "state", "optim.step", torch_saved(CreatesMarker(marker)))
    recommit(folder)
    resumed = run_cli(
        "titanpod.pretrain.cli",
        ["--train.steps", "4", *run[2:], "--output.run-name", "resumed", "--checkpoint.resume", str(folder)],
        tmp_path,
    )
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 1, output[-3000:]
    assert "declares 'optim.step' as a pickled Python object" in output and "Traceback" not in output
    assert not marker.exists()


ORBAX_ATTACKS = ("metadata_pickled", "aggregate_pickled", "aggregate_object_array")
"""The crafted Orbax checkpoints ``crafted_orbax_worker.py`` loads (besides each of its files made a pickle)."""


@pytest.fixture(scope="module")
def orbax_outcomes(tmp_path_factory) -> dict[str, dict]:
    """Every crafted Orbax checkpoint's outcome when loaded (in one subprocess: jax stays out of this one)."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("crafted_orbax_worker.py")), str(tmp_path_factory.mktemp("o"))],
        env={**os.environ, **XLA_ENV, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=300, check=False, cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("attack", ORBAX_ATTACKS)
def test_a_crafted_orbax_checkpoint_is_refused_and_runs_nothing(orbax_outcomes, attack):
    outcome = orbax_outcomes[attack]
    assert not outcome["marker"], attack
    assert outcome["error"].startswith("CheckpointError: Cannot load the Orbax state in "), outcome


def test_no_file_of_an_orbax_checkpoint_runs_a_pickle_put_in_its_place(orbax_outcomes):
    replaced = {name: outcome for name, outcome in orbax_outcomes.items() if name.startswith("file ")}
    assert {"file _METADATA", "file manifest.ocdbt"} <= set(replaced)
    assert not [name for name, outcome in replaced.items() if outcome["marker"]]
    assert orbax_outcomes["untouched"] == {"error": None, "marker": False}  # the worker's own checkpoint loads


def test_a_trainer_json_that_is_a_pickle_is_unreadable_and_runs_nothing(tmp_path):
    checkpointer, model, step, folder = small_checkpoint(tmp_path)
    marker = tmp_path / "ran"
    replace_trainer_file(folder, pickle.dumps(CreatesMarker(marker)))
    with pytest.raises(CheckpointError, match=r"trainer\.json is missing or unreadable"):
        checkpointer.load(folder, model, step, RECIPE)
    assert not marker.exists()


def test_code_written_into_trainer_json_stays_text(tmp_path):
    """JSON holds no objects: strings that would run under eval, YAML or pickle are compared as text, never run."""
    checkpointer, model, step, folder = small_checkpoint(tmp_path)
    marker = tmp_path / "ran"
    code = f"__import__('os').system('touch {marker}')"
    trainer = json.loads((folder / TRAINER_FILE).read_text())
    trainer["recipe"] = {"name": code, "train": {"lr": f"!!python/object/apply:os.system ['touch {marker}']"}}
    trainer["data"] = {"index": 1, "kind": pickle.dumps(CreatesMarker(marker)).hex(), "__reduce__": code}
    (folder / TRAINER_FILE).write_text(json.dumps(trainer))
    recommit(folder)
    with pytest.raises(CheckpointError, match=r"from a different run: name: \"__import__"):
        checkpointer.load(folder, model, step, RECIPE)
    assert not marker.exists()
    torch.testing.assert_close(dict(model.named_parameters())["first.weight"].detach(), torch.ones(64, 32))
