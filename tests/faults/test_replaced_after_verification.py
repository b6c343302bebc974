"""A checkpoint file replaced after it was verified is verified again: hashes are remembered per
``Checkpointer``, only while a file's device, inode, size, modification and status-change times all stay."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.crafted_checkpoints import small_checkpoint
from tests.faults.kill_worker import build
from titanpod.checkpoint import CheckpointError, checksums, read_trainer_file

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

RECIPE = {"name": "faults"}
DATA_FILE = "__0_0.distcp"


def test_a_file_overwritten_in_place_with_its_old_size_and_times_is_hashed_again(tmp_path):
    checkpointer, model, step, folder = small_checkpoint(tmp_path)
    checkpointer.load(folder, model, step, RECIPE)  # verified: its hashes are remembered
    data = folder / "state" / DATA_FILE
    before = data.stat()
    with data.open("r+b") as handle:  # same inode, same size
        handle.seek(before.st_size // 2)
        handle.write(b"\xff\xfe\xfd\xfc")
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))  # the modification time set back
    after = data.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    with pytest.raises(CheckpointError, match=rf"damaged: state/{DATA_FILE} has xxh3_128 \w{{32}}, the manifest says"):
        checkpointer.load(folder, model, step, RECIPE)


def test_hashes_are_remembered_by_one_checkpointer_and_shared_with_none(tmp_path, monkeypatch):
    checkpointer, model, step, folder = small_checkpoint(tmp_path)
    reads: Counter[str] = Counter()
    digest = checksums.file_digest

    def counted(location: object, hash_name: str = checksums.HASH) -> str:
        reads[Path(str(location)).name] += 1
        return digest(location, hash_name)  # type: ignore[arg-type]

    monkeypatch.setattr(checksums, "file_digest", counted)
    checkpointer.load(folder, model, step, RECIPE)
    checkpointer.load(folder, model, step, RECIPE)
    assert reads[DATA_FILE] == 1  # unchanged: read for its hash once by this checkpointer
    other = build(tmp_path, "sync")[0]
    other.load(folder, model, step, RECIPE)
    assert reads[DATA_FILE] == 2  # another checkpointer reads it itself
    read_trainer_file(folder)
    assert reads[DATA_FILE] == 3  # outside a checkpointer every check reads the file
