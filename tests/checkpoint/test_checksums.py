"""Every checkpoint file's content hash (XXH3-128) is recorded when it is written and checked before it is loaded."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch
import xxhash

from tests.graph.test_step_modes import BACKEND, TINY, random_batches, tiny_model
from titanpod.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    CheckpointError,
    load_hf_checkpoint,
    load_model,
    load_weights,
    save_hf_checkpoint,
    save_model,
)
from titanpod.checkpoint.checksums import CHECKSUMS_FILE
from titanpod.checkpoint.step_folders import TRAINER_FILE, write_marker
from titanpod.graph import EagerStep, TrainConfig
from titanpod.models import Transformer
from titanpod.recipes.families import decoder_adapters, hf_adapter

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def xxh3(path: Path) -> str:
    return xxhash.xxh3_128(path.read_bytes()).hexdigest()


def flip_bytes(path: Path) -> None:
    """Invert four bytes in the middle of ``path``: its size stays the same."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = bytes(byte ^ 0xFF for byte in data[middle : middle + 4])
    path.write_bytes(bytes(data))


def trained_step() -> EagerStep:
    step = EagerStep(tiny_model(), TrainConfig(), BACKEND)
    step([next(random_batches(TINY.vocab_size))], 1e-3)
    return step


def save_state(tmp_path: Path, async_save: bool = False) -> tuple[Checkpointer, EagerStep, Path]:
    step = trained_step()
    saver = Checkpointer(tmp_path, CheckpointConfig(async_save=async_save), "{}", say=lambda _: None)
    saver.save(1, step.model, step, {"index": 1})
    saver.wait()
    return saver, step, tmp_path / "checkpoints" / "step-000001"


def parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in model.named_parameters()}


@pytest.mark.parametrize("async_save", [False, True])
def test_trainer_json_records_each_files_size_and_hash(tmp_path, async_save):
    _, _, folder = save_state(tmp_path, async_save)
    files = json.loads((folder / TRAINER_FILE).read_text())["files"]
    assert set(files) == {"state/.metadata", "state/__0_0.distcp"}  # trainer.json itself: the marker's hash
    for name, item in files.items():
        assert item == {"size": (folder / name).stat().st_size, "xxh3_128": xxh3(folder / name)}


def test_a_flipped_byte_in_the_trainer_state_is_named_before_anything_loads(tmp_path):
    saver, _, folder = save_state(tmp_path)
    data_file = folder / "state" / "__0_0.distcp"
    recorded, size = xxh3(data_file), data_file.stat().st_size
    flip_bytes(data_file)
    assert data_file.stat().st_size == size
    fresh = EagerStep(tiny_model(), TrainConfig(), BACKEND)
    before = parameters(fresh.model)
    expected = (
        rf"The checkpoint {re.escape(str(folder))} is damaged: state/__0_0\.distcp has xxh3_128 {xxh3(data_file)}, "
        rf"the manifest says {recorded} \(flipped bytes or an overwrite\)\. No earlier checkpoint in "
        rf"{re.escape(str(folder.parent))} passes its checks: resume from another checkpoint"
    )
    with pytest.raises(CheckpointError, match=expected):
        saver.load(folder, fresh.model, fresh, {})
    after = parameters(fresh.model)
    assert all(torch.equal(after[name], before[name]) for name in before)  # nothing was loaded


def test_a_checkpoint_with_an_old_size_only_manifest_still_loads(tmp_path):
    saver, step, folder = save_state(tmp_path)
    trainer = json.loads((folder / TRAINER_FILE).read_text())
    trainer["format"] = 1
    trainer["files"] = {name: item["size"] for name, item in trainer["files"].items()}
    trainer_bytes = (json.dumps(trainer, indent=2) + "\n").encode()
    (folder / TRAINER_FILE).write_bytes(trainer_bytes)
    write_marker(folder, 1, trainer_bytes)
    fresh = EagerStep(tiny_model(), TrainConfig(), BACKEND)
    resumed = saver.load(folder, fresh.model, fresh, {})
    assert resumed.step == 1 and resumed.data_state == {"index": 1}
    saved, loaded = parameters(step.model), parameters(fresh.model)
    assert all(torch.equal(loaded[name], saved[name]) for name in saved)


def test_a_manifest_written_with_sha256_is_still_checked(tmp_path):
    saver, _, folder = save_state(tmp_path)
    trainer = json.loads((folder / TRAINER_FILE).read_text())
    trainer["files"] = {
        name: {"size": item["size"], "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest()}
        for name, item in trainer["files"].items()
    }
    trainer_bytes = (json.dumps(trainer, indent=2) + "\n").encode()
    (folder / TRAINER_FILE).write_bytes(trainer_bytes)
    write_marker(folder, 1, trainer_bytes)
    fresh = EagerStep(tiny_model(), TrainConfig(), BACKEND)
    assert saver.load(folder, fresh.model, fresh, {}).step == 1  # whole: loads
    flip_bytes(folder / "state" / "__0_0.distcp")
    with pytest.raises(CheckpointError, match=r"state/__0_0\.distcp has sha256 \w{64}, the manifest says"):
        saver.load(folder, fresh.model, fresh, {})


def test_a_state_that_does_not_fit_is_a_checkpoint_error_not_dcps_base_exception(tmp_path):
    saver, _, folder = save_state(tmp_path)
    wider = Transformer(TINY.__class__(**{**TINY.__dict__, "dim": 128}))
    wider.init_weights(0)
    step = EagerStep(wider, TrainConfig(), BACKEND)
    with pytest.raises(CheckpointError, match=r"Cannot load the trainer state in .*: rank 0: \w+"):
        saver.load(folder, wider, step, {})


def test_a_flipped_byte_in_exported_weights_is_named(tmp_path):
    model = tiny_model()
    save_model(model, "llama3", tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    recorded = json.loads((tmp_path / "model" / CHECKSUMS_FILE).read_text())["files"]
    assert recorded == {"model.safetensors": {"size": weights.stat().st_size, "xxh3_128": xxh3(weights)}}
    assert torch.equal(load_model(tmp_path / "model")[1].output.weight, model.output.weight)  # whole: loads
    flip_bytes(weights)
    with pytest.raises(CheckpointError, match=r"damaged: model\.safetensors has xxh3_128 \w{32}, the manifest says"):
        load_weights(tiny_model(), tmp_path / "model")


def test_a_flipped_byte_in_one_shard_of_a_hugging_face_export_is_named(tmp_path):
    model = tiny_model()
    folder = save_hf_checkpoint(model, hf_adapter("llama3"), tmp_path / "hf", max_shard_size="40KB")
    recorded = json.loads((folder / CHECKSUMS_FILE).read_text())["files"]
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2 and set(recorded) == {path.name for path in shards} | {"model.safetensors.index.json"}
    assert all(recorded[path.name]["xxh3_128"] == xxh3(path) for path in shards)
    load_hf_checkpoint(folder, adapters=decoder_adapters())  # whole: loads
    flip_bytes(shards[1])
    with pytest.raises(CheckpointError, match=rf"damaged: {shards[1].name} has xxh3_128 \w{{32}}, the manifest says"):
        load_hf_checkpoint(folder, adapters=decoder_adapters())


def test_weights_written_elsewhere_without_checksums_load_unchecked(tmp_path):
    model = tiny_model()
    folder = save_hf_checkpoint(model, hf_adapter("llama3"), tmp_path / "hf")
    (folder / CHECKSUMS_FILE).unlink()  # a folder from transformers or the Hub has none
    assert torch.equal(load_hf_checkpoint(folder, adapters=decoder_adapters()).model.output.weight, model.output.weight)
