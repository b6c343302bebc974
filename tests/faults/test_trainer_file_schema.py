"""A ``trainer.json`` holding a value of the wrong type or out of range is refused on resume, before anything
loads, with a message naming the file and the field (its ``COMMITTED`` marker rewritten to match, so the refusal
is the field check's). One test per bad value."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.faults.crafted_checkpoints import replace_trainer_file, small_checkpoint
from titanpod.checkpoint import CheckpointError
from titanpod.checkpoint.step_folders import COMMIT_MARKER, TRAINER_FILE

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

Change = Callable[[dict[str, Any]], Any]
"""Changes a saved ``trainer.json`` (parsed) in place, or returns what replaces it whole."""


def first_file(trainer: dict[str, Any]) -> dict[str, Any]:
    return trainer["files"]["state/.metadata"]


BAD_VALUES: dict[str, tuple[Change, str]] = {
    "files a list": (
        lambda t: t.update(files=list(t["files"])),
        r"trainer\.json: files is \['state/\.metadata', 'state/__0_0\.distcp'\]; it must be an object of file path",
    ),
    "recipe null": (lambda t: t.update(recipe=None), r"trainer\.json: recipe is None; it must be an object"),
    "recipe a list": (lambda t: t.update(recipe=["faults"]), r"recipe is \['faults'\]; it must be an object"),
    "step 10**12": (
        lambda t: t.update(step=10**12),
        r"trainer\.json: step is 1000000000000; it must be 1, the step of its folder step-000001",
    ),
    "step negative": (lambda t: t.update(step=-1), r"step is -1; it must be a non-negative integer"),
    "step text": (lambda t: t.update(step="1"), r"step is '1'; it must be a non-negative integer"),
    "step true": (lambda t: t.update(step=True), r"step is True; it must be a non-negative integer"),
    "step a float": (lambda t: t.update(step=1.0), r"step is 1\.0; it must be a non-negative integer"),
    "step missing": (lambda t: t.pop("step"), r"trainer\.json: step is missing; it must be present"),
    "data index -3": (lambda t: t.update(data={"index": -3}), r"trainer\.json: data\.index is -3; it must be a non-"),
    "data a list": (lambda t: t.update(data=[1]), r"data is \[1\]; it must be an object \(the data loader's position"),
    "data epoch text": (
        lambda t: t.update(data={"kind": "packed", "epoch": "0", "index": 1, "seed": 0}),
        r"data\.epoch is '0'; it must be a non-negative integer",
    ),
    "data of one rank negative": (
        lambda t: t.update(data={"per_rank": [{"position": 1}, {"position": -1}]}),
        r"data\.per_rank\[1\]\.position is -1",
    ),
    "data per_rank not a list": (
        lambda t: t.update(data={"per_rank": {"position": 1}}),
        r"data\.per_rank is \{'position': 1\}; it must be a list",
    ),
    "data nested image position negative": (
        lambda t: t.update(data={"images": {"kind": "images", "index": -2}, "index": 1, "seed": 0}),
        r"data\.images\.index is -2",
    ),
    "data kind not text": (lambda t: t.update(data={"index": 1, "kind": 5}), r"data\.kind is 5; it must be a string"),
    "data seed not an integer": (
        lambda t: t.update(data={"index": 1, "seed": "x"}),
        r"data\.seed is 'x'; it must be an integer",
    ),
    "file outside the folder": (
        lambda t: t["files"].update({"../../secret": {"size": 1}}),
        r"files\['\.\./\.\./secret'\] is '\.\./\.\./secret'; it must be a /-separated path inside the checkpoint",
    ),
    "file an absolute path": (
        lambda t: t["files"].update({"/etc/hostname": 3}),
        r"files\['/etc/hostname'\] is '/etc/hostname'; it must be a /-separated path inside",
    ),
    "file size negative": (
        lambda t: first_file(t).update(size=-1),
        r"files\['state/\.metadata'\]\.size is -1; it must be a non-negative integer",
    ),
    "file size missing": (
        lambda t: first_file(t).pop("size"),
        r"files\['state/\.metadata'\]\.size is None; it must be a non-negative integer",
    ),
    "file hash not hex": (
        lambda t: first_file(t).update(xxh3_128="not a hash"),
        r"files\['state/\.metadata'\]\.xxh3_128 is 'not a hash'; it must be 32 lowercase hex digits",
    ),
    "file entry with other fields": (
        lambda t: first_file(t).update(md5="0" * 32),
        r"files\['state/\.metadata'\] is .*; it must be size and hash only \(it also has md5\)",
    ),
    "file entry text": (
        lambda t: t["files"].update({"state/.metadata": "big"}),
        r"files\['state/\.metadata'\] is 'big'; it must be a size",
    ),
    "data file fingerprint not hex": (
        lambda t: t.update(data_files={"corpus.txt": {"size": 9, "head_bytes": 9, "head_sha256": "x"}}),
        r"data_files\['corpus\.txt'\]\.head_sha256 is 'x'; it must be 64 lowercase hex digits",
    ),
    "data file size negative": (
        lambda t: t.update(data_files={"corpus.txt": {"size": -9, "head_bytes": 9, "head_sha256": "0" * 64}}),
        r"data_files\['corpus\.txt'\]\.size is -9; it must be a non-negative integer",
    ),
    "format text": (lambda t: t.update(format="2"), r"trainer\.json has format '2'; this version reads \(1, 2\)"),
    "format newer": (lambda t: t.update(format=3), r"has format 3; this version reads \(1, 2\) \(a newer titanpod"),
    "whole file a list": (lambda t: [t], r"trainer\.json: the whole file is \[.*\]; it must be a JSON object"),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_a_bad_value_is_refused_naming_the_file_and_field(tmp_path, case):
    change, message = BAD_VALUES[case]
    checkpointer, model, step, folder = small_checkpoint(tmp_path)
    trainer = json.loads((folder / TRAINER_FILE).read_text())
    replaced = change(trainer)
    replace_trainer_file(folder, json.dumps(replaced if isinstance(replaced, list) else trainer).encode())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    with pytest.raises(CheckpointError, match=message) as refused:
        checkpointer.load(folder, model, step, {"name": "faults"})
    assert "resume from another checkpoint" in str(refused.value) or "update titanpod" in str(refused.value)
    assert all(not parameter.any() for parameter in model.parameters())  # refused before anything loaded


def test_json_nested_too_deep_to_parse_is_unreadable(tmp_path):
    checkpointer, model, step, folder = small_checkpoint(tmp_path)
    replace_trainer_file(folder, b"[" * 200_000)
    with pytest.raises(CheckpointError, match=r"trainer\.json is missing or unreadable \(maximum recursion"):
        checkpointer.load(folder, model, step, {"name": "faults"})


def test_a_checkpoint_copied_under_another_name_still_loads(tmp_path):
    """The step is held against the folder's name only where that name is ``step-NNNNNN``."""
    checkpointer, model, step, folder = small_checkpoint(tmp_path, step_number=3)
    copy = tmp_path / "kept-for-later"
    shutil.copytree(folder, copy)
    assert (copy / COMMIT_MARKER).is_file()
    point = checkpointer.load(copy, model, step, {"name": "faults"})
    assert point.step == 3 and point.data_state == {"index": 3}
