"""Checkpoints as an attacker would craft them: a payload that creates a marker file if anything unpickles it,
put where a loader might unpickle it, then the manifest hashes in ``trainer.json`` and the ``COMMITTED`` marker
recomputed (they are unkeyed), so every hash check passes and only the loader's own refusal stands in the way."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

from tests.faults.kill_worker import build, fill
from titanpod.checkpoint.checksums import manifest_of
from titanpod.checkpoint.dcp_reader import load_metadata_bytes
from titanpod.checkpoint.locations import file_sizes
from titanpod.checkpoint.step_folders import COMMIT_MARKER, TRAINER_FILE, write_marker
from titanpod.checkpoint.trainer_state import Checkpointer


class CreatesMarker:
    """Unpickles by calling ``open(path, "w")``: the file at ``path`` appears if anything unpickles it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def torch_saved(value: Any) -> bytes:
    """``value`` as ``torch.save`` writes it (what DCP stores for a non-tensor entry, and a tensor's bytes)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def small_checkpoint(root: Path, step_number: int = 1) -> tuple[Checkpointer, torch.nn.Module, Any, Path]:
    """A real trainer checkpoint of a small model at ``root/checkpoints/step-NNNNNN``, and what loads it."""
    checkpointer, model, step = build(root, "sync")
    fill(model, step_number)
    checkpointer.save(step_number, model, step, {"index": step_number})
    return checkpointer, model, step, root / "checkpoints" / f"step-{step_number:06d}"


def recommit(folder: Path) -> None:
    """Record every file of ``folder`` afresh in its ``trainer.json`` manifest and write ``COMMITTED`` for the
    result, as anyone holding the folder can: the checks on load then pass whatever the files hold."""
    trainer = json.loads((folder / TRAINER_FILE).read_text())
    sizes = {name: size for name, size in file_sizes(folder).items() if name not in (TRAINER_FILE, COMMIT_MARKER)}
    trainer["files"] = manifest_of(folder, sizes)
    trainer_bytes = (json.dumps(trainer, indent=2) + "\n").encode()
    (folder / TRAINER_FILE).write_bytes(trainer_bytes)
    write_marker(folder, trainer["step"], trainer_bytes)


def declare_pickled_entry(state_folder: Path, key: str, payload: bytes, data_file: str = "__1_0.distcp") -> None:
    """Turn the DCP entry ``key`` of ``state_folder`` into a pickled-object entry (``BytesStorageMetadata``) whose
    bytes, ``payload``, are the new file ``data_file``: what DCP's loader unpickles without restriction."""
    metadata = load_metadata_bytes((state_folder / ".metadata").read_bytes())
    metadata.state_dict_metadata[key] = BytesStorageMetadata()
    metadata.storage_data = {index: info for index, info in metadata.storage_data.items() if index.fqn != key}
    metadata.storage_data[MetadataIndex(key)] = _StorageInfo(data_file, 0, len(payload))
    (state_folder / data_file).write_bytes(payload)
    (state_folder / ".metadata").write_bytes(pickle.dumps(metadata))


def replace_tensor_bytes(state_folder: Path, key: str, payload: bytes, data_file: str = "__1_0.distcp") -> None:
    """Point the tensor entry ``key`` of ``state_folder`` at ``payload`` (in the new file ``data_file``) in place of
    its tensor's bytes: what DCP reads with ``torch.load(weights_only=True)``."""
    metadata = load_metadata_bytes((state_folder / ".metadata").read_bytes())
    indices = [index for index in metadata.storage_data if index.fqn == key]
    for index in indices:
        metadata.storage_data[index] = _StorageInfo(data_file, 0, len(payload))
    (state_folder / data_file).write_bytes(payload)
    (state_folder / ".metadata").write_bytes(pickle.dumps(metadata))


def replace_trainer_file(folder: Path, text: bytes) -> None:
    """Make ``text`` the ``trainer.json`` of ``folder`` and write ``COMMITTED`` for it: the marker's check passes, so
    what refuses the file is the check of its fields."""
    (folder / TRAINER_FILE).write_bytes(text)
    write_marker(folder, 1, text)
