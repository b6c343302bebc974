"""Trainer checkpoints at fsspec URLs (``memory://``, ``file://``; ``gs://`` works the same through gcsfs).

Object stores have no rename: a save writes straight into ``step-NNNNNN/`` and its ``COMMITTED``
marker, written last, is what makes the folder a checkpoint. These tests run in this process,
because the ``memory://`` filesystem lives in the process that writes it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import re
from typing import ClassVar

import fsspec
import pytest
import torch

from tests.checkpoint.test_trainer_state import final_weights, recipe
from tests.conftest import XLA_ENV, run_json_script
from tests.graph.test_step_modes import BACKEND, random_batches, tiny_model
from titanpod.checkpoint import CheckpointConfig, Checkpointer, CheckpointError, complete_checkpoints, read_trainer_file
from titanpod.checkpoint import trainer_save as trainer_save_module
from titanpod.checkpoint.dcp_reader import UnsafeCheckpointError, safe_reader
from titanpod.checkpoint.orbax_state import orbax_location
from titanpod.graph import EagerStep, TrainConfig
from titanpod.runs import run_pretraining

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def memory_url(request):
    """A fresh ``memory://`` folder for one test, emptied afterwards (the memory filesystem is process-wide)."""
    url = f"memory://titanpod-tests/{re.sub(r'[^A-Za-z0-9_-]', '-', request.node.name)}"  # no glob characters
    memory = fsspec.filesystem("memory")
    if memory.exists(url):
        memory.rm(url, recursive=True)
    yield url
    if memory.exists(url):
        memory.rm(url, recursive=True)


def train_steps(step: EagerStep, batches, count: int) -> list[float]:
    return [float(step([next(batches)], 1e-3).loss) for _ in range(count)]


def checkpointer(location: str, tmp_path, messages: list[str] | None = None, **config) -> Checkpointer:
    say = messages.append if messages is not None else (lambda _: None)
    return Checkpointer(tmp_path, CheckpointConfig(dir=location, **config), "{}", say)


def test_a_run_checkpointed_to_memory_resumes_bit_exactly(tmp_path, memory_url):
    straight = run_pretraining(recipe(tmp_path, 4, "straight", resume="never", at_end=False))
    first = run_pretraining(recipe(tmp_path, 4, "split", stop_at=2, dir=memory_url))
    assert [step for step, _ in complete_checkpoints(memory_url)] == [2]
    assert not (first.run_dir / "checkpoints").exists()  # everything went to the URL
    second = run_pretraining(recipe(tmp_path, 4, "split", dir=memory_url))
    assert second.summary.start_step == 2 and second.summary.steps_done == 4
    assert first.summary.losses + second.summary.losses == straight.summary.losses  # bit for bit
    ours, theirs = final_weights(second), final_weights(straight)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_a_saved_step_loads_back_exactly_and_trains_on_identically(tmp_path, memory_url, scheme):
    location = memory_url if scheme == "memory" else f"file://{tmp_path / 'store'}"
    step, batches = EagerStep(tiny_model(), TrainConfig(), BACKEND), random_batches(64)
    train_steps(step, batches, 2)
    saver = checkpointer(location, tmp_path)
    saver.save(2, step.model, step, {"index": 2})
    folder = f"{location}/step-000002"
    assert [path for _, path in complete_checkpoints(location)] == [folder]
    marker = json.loads(fsspec.open(f"{folder}/COMMITTED").open().read())
    assert marker["step"] == 2 and len(marker["trainer_sha256"]) == 64
    if scheme == "file":  # no staging folder: the step folder is written in place
        assert sorted(path.name for path in (tmp_path / "store").iterdir()) == ["step-000002"]

    fresh = EagerStep(tiny_model(), TrainConfig(), BACKEND)
    point = saver.load(folder, fresh.model, fresh, {})
    assert point.step == 2 and point.data_state == {"index": 2} and point.folder == folder
    same_batches = random_batches(64)
    for _ in range(2):
        next(same_batches)  # the batches the saved step has already trained on
    assert train_steps(fresh, same_batches, 3) == train_steps(step, batches, 3)
    assert all(torch.equal(a, b) for a, b in zip(fresh.model.parameters(), step.model.parameters(), strict=True))


def test_a_save_cut_short_before_its_marker_is_ignored_then_removed(tmp_path, memory_url, monkeypatch):
    step, batches = EagerStep(tiny_model(), TrainConfig(), BACKEND), random_batches(64)
    train_steps(step, batches, 2)
    checkpointer(memory_url, tmp_path).save(2, step.model, step, {"index": 2})

    def killed(*_):
        raise KeyboardInterrupt("killed before the marker")

    monkeypatch.setattr(trainer_save_module, "write_marker", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpointer(memory_url, tmp_path).save(4, step.model, step, {"index": 4})
    monkeypatch.undo()
    unfinished = f"{memory_url}/step-000004"
    assert fsspec.filesystem("memory").isfile(f"{unfinished}/trainer.json")  # every file but the marker

    messages: list[str] = []
    resumer = checkpointer(memory_url, tmp_path, messages)
    assert resumer.resume_folder() == f"{memory_url}/step-000002"
    assert messages == [f"ignoring {unfinished}: no COMMITTED marker (a save that did not finish)"]
    with pytest.raises(CheckpointError, match=r"step-000004: no COMMITTED marker \(a save that did not finish\)"):
        read_trainer_file(unfinished)
    with pytest.raises(CheckpointError, match=r"not a complete checkpoint: .*step-000004: no COMMITTED marker"):
        checkpointer(memory_url, tmp_path, resume=unfinished).resume_folder()

    messages.clear()
    assert resumer.remove_partial() == [unfinished]
    why = "no COMMITTED marker: a save that did not finish"
    assert messages == [f"removed {unfinished}: an incomplete checkpoint ({why})"]
    assert not fsspec.filesystem("memory").exists(unfinished)
    assert [step for step, _ in complete_checkpoints(memory_url)] == [2]


def test_a_trainer_file_changed_after_its_marker_is_refused(tmp_path, memory_url):
    step = EagerStep(tiny_model(), TrainConfig(), BACKEND)
    checkpointer(memory_url, tmp_path).save(1, step.model, step, {"index": 1})
    trainer_file = f"{memory_url}/step-000001/trainer.json"
    memory = fsspec.filesystem("memory")
    memory.pipe_file(trainer_file, memory.cat_file(trainer_file).replace(b'"index": 1', b'"index": 7'))
    with pytest.raises(CheckpointError, match=r"damaged: its trainer\.json is not the one its COMMITTED marker"):
        read_trainer_file(f"{memory_url}/step-000001")


def test_background_saves_to_memory_keep_the_last_k(tmp_path, memory_url):
    step, batches = EagerStep(tiny_model(), TrainConfig(), BACKEND), random_batches(64)
    saver = checkpointer(memory_url, tmp_path, keep_last=2, async_save=True)
    for number in range(1, 5):
        train_steps(step, batches, 1)
        saver.save(number, step.model, step, {"index": number})
    saver.wait()
    assert [number for number, _ in complete_checkpoints(memory_url)] == [3, 4]
    memory = fsspec.filesystem("memory")
    assert not memory.exists(f"{memory_url}/step-000001") and not memory.exists(f"{memory_url}/step-000002")
    assert read_trainer_file(f"{memory_url}/step-000004")["data"] == {"index": 4}


def test_pickled_metadata_at_a_url_is_read_with_the_restricted_unpickler(memory_url):
    memory = fsspec.filesystem("memory")
    memory.pipe_file(f"{memory_url}/state/.metadata", pickle.dumps(os.system))  # would run a command on load
    with pytest.raises(UnsafeCheckpointError, match=r"refers to \w+\.system, which DCP metadata never contains"):
        safe_reader(f"{memory_url}/state").read_metadata()


class JaxFormatStep(EagerStep):
    """A step whose state Orbax would save (as the xla lane's does)."""

    state_format: ClassVar = "jax"  # type: ignore[assignment]


ORBAX_ROUND_TRIP = """
import json, sys
import numpy as np
from titanpod.checkpoint.orbax_state import restore_orbax_state, save_orbax_state
url = "file://" + sys.argv[1] + "/orbax"
tree = {"model": {"a.b": np.arange(6, dtype=np.float32).reshape(2, 3)}, "optim": {"step": np.array(3)}}
save_orbax_state(url, tree)
back = restore_orbax_state(url)
same = np.array_equal(back["model"]["a.b"], tree["model"]["a.b"]) and int(back["optim"]["step"]) == 3
print(json.dumps({"same": bool(same)}))
"""


def test_orbax_writes_and_reads_a_file_url(tmp_path):
    result = run_json_script(ORBAX_ROUND_TRIP.replace("sys.argv[1]", repr(str(tmp_path))), env=XLA_ENV)
    assert result == {"same": True}
    assert (tmp_path / "orbax" / "_METADATA").is_file()  # the URL's local folder


def test_orbax_takes_local_file_and_gs_locations_and_refuses_others_before_training(tmp_path, memory_url):
    assert orbax_location(f"file://{tmp_path}/orbax") == (tmp_path / "orbax").resolve()
    assert orbax_location("gs://bucket/run/orbax") == "gs://bucket/run/orbax"
    step = JaxFormatStep(tiny_model(), TrainConfig(), BACKEND)
    checkpointer(f"file://{tmp_path}", tmp_path).check_step(step)
    with pytest.raises(CheckpointError, match=r"Orbax .* cannot write to memory://.*file:// URLs and gs://, s3://"):
        checkpointer(memory_url, tmp_path).check_step(step)


def test_cloud_storage_without_gcsfs_says_how_to_install_it(tmp_path):
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here")
    with pytest.raises(CheckpointError, match=r"needs gcsfs.*pip install gcsfs.*titanpod-checkpoint\[gcs\]"):
        checkpointer("gs://bucket/run/checkpoints", tmp_path)


def test_resume_needs_no_earlier_run_directory_when_the_checkpoints_are_elsewhere(tmp_path, memory_url):
    from titanpod.runs.pretrain import with_resume

    resumed = with_resume(recipe(tmp_path, 4, "", resume="never", dir=memory_url))
    assert resumed.checkpoint.resume == "auto" and resumed.checkpoint.dir == memory_url
    with pytest.raises(ValueError, match="has a complete checkpoint"):
        with_resume(recipe(tmp_path, 4, ""))


def test_the_command_line_sets_the_checkpoint_dir():
    from titanpod.pretrain.command import parse_command

    command = parse_command(["--checkpoint.dir", "gs://bucket/run/checkpoints", "--checkpoint.every", "5"])
    assert command is not None
    assert command.recipe.checkpoint.dir == "gs://bucket/run/checkpoints" and command.recipe.checkpoint.every == 5
