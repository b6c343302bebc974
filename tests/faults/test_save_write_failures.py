"""A checkpoint save whose writes fail mid-run is named for what failed and what to do, and the run still leaves
its final weights where it can; a save that finds no space left while bytes are free is named as a file system
out of inodes (``os.statvfs`` and the writer monkeypatched).

Tests run as root here, and root writes through ``chmod``: a folder made read-only is simulated in-process, by a
checkpoint writer whose writes fail as a read-only file system's do (``EROFS``, inside DCP's own error), from a
given step on. The same run against a folder really made read-only with ``chmod`` runs only when not root.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoint.test_disk_full_checkpoint import no_space
from tests.faults.kill_worker import build
from titanpod.checkpoint import trainer_state
from titanpod.checkpoint.disk_space import DiskFullError
from titanpod.checkpoint.trainer_file import read_trainer_file
from titanpod.pretrain.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

STEPS, EVERY, FAILS_AT = 6, 2, 4
"""The run's steps, its checkpoint interval, and the first save whose writes fail."""


def run_args(tmp_path: Path) -> list[str]:
    return ["--train.steps", str(STEPS), "--train.warmup-steps", "1", "--train.log-every", "1",
            "--data.seq-len", "32", "--data.batch-size", "2", "--checkpoint.every", str(EVERY),
            "--output.runs-dir", str(tmp_path / "runs"), "--output.run-name", "run",
            "--output.no-tensorboard"]  # fmt: skip


def step_of(folder: object) -> int:
    return int(re.search(r"step-(\d+)", str(folder)).group(1))


def writes_failing_from(step: int, code: int) -> Callable[[Any], Any]:
    """A ``state_writer`` whose writes into the save of ``step`` and later fail with ``OSError(code)``."""
    real = trainer_state.state_writer

    def writer(folder: Any) -> Any:
        found = real(folder)
        if step_of(folder) >= step:

            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise OSError(code, os.strerror(code), str(Path(folder) / "__0_0.distcp"))

            found.write_data = refuse
        return found

    return writer


def check_stopped_with_weights(tmp_path: Path, code: int, output: str) -> None:
    """The run stopped after the failed save with exit 1, named it, and wrote its final weights."""
    run_dir = tmp_path / "runs" / "run"
    checkpoints = run_dir / "checkpoints"
    assert code == 1, output[-3000:]
    assert f"Cannot save the checkpoint of step {FAILS_AT}: the checkpoint folder {checkpoints} is not writable (" in (
        output
    )
    assert "Make it writable again: the same command then resumes from the newest checkpoint" in output
    assert (
        f"The run stops after this step and writes its final weights to {run_dir}; the newest checkpoint is "
        f"{checkpoints / 'step-000002'}." in output
    )
    assert "Traceback" not in output
    model = json.loads((run_dir / "model" / "model.json").read_text())
    assert model["about"]["steps"] == FAILS_AT  # the final weights are the model after the step whose save failed
    assert [path.name for path in checkpoints.iterdir() if path.name.startswith(("step-", ".step-"))] == ["step-000002"]
    read_trainer_file(checkpoints / "step-000002")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == FAILS_AT


def test_a_checkpoint_folder_gone_read_only_mid_run_is_named_and_the_weights_still_written(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(trainer_state, "state_writer", writes_failing_from(FAILS_AT, errno.EROFS))
    code = main(run_args(tmp_path))
    captured = capsys.readouterr()
    output = captured.out + captured.err
    check_stopped_with_weights(tmp_path, code, output)
    assert f"not writable (Read-only file system: {tmp_path / 'runs' / 'run' / 'checkpoints'}/.step-000004." in output


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder chmod made read-only")
def test_a_checkpoint_folder_made_read_only_with_chmod_mid_run(tmp_path, monkeypatch, capsys):
    real = trainer_state.save_target
    checkpoints = tmp_path / "runs" / "run" / "checkpoints"

    def save_target(folder: Any, step_number: int, *args: Any) -> Any:
        if step_number == FAILS_AT:
            checkpoints.chmod(0o555)
        return real(folder, step_number, *args)

    monkeypatch.setattr(trainer_state, "save_target", save_target)
    try:
        code = main(run_args(tmp_path))
    finally:
        checkpoints.chmod(0o755)
    captured = capsys.readouterr()
    check_stopped_with_weights(tmp_path, code, captured.out + captured.err)


def statvfs_with(free_bytes: int, free_files: int, files: int = 1_000_000) -> Callable[[Any], os.statvfs_result]:
    """An ``os.statvfs`` whose every file system has ``free_bytes`` free and ``free_files`` of ``files`` inodes."""
    block = 4096

    def statvfs(path: Any) -> os.statvfs_result:
        blocks = free_bytes // block
        return os.statvfs_result((block, block, 4 * blocks, blocks, blocks, files, free_files, free_files, 0, 255))

    return statvfs


@pytest.mark.parametrize("free_files", [0, 12])
def test_no_space_left_while_bytes_are_free_is_named_as_out_of_inodes(tmp_path, monkeypatch, free_files):
    checkpointer, model, step = build(tmp_path, "sync")
    checkpointer.save(1, model, step, {"index": 1})
    free = 3 * 2**30
    monkeypatch.setattr(os, "statvfs", statvfs_with(free, free_files))
    monkeypatch.setattr(trainer_state.dcp, "save", no_space)
    with pytest.raises(DiskFullError) as full:
        checkpointer.save(2, model, step, {"index": 2})
    message = str(full.value)
    assert message.startswith(
        f"The file system of {tmp_path / 'checkpoints' / '.step-000002.partial'} is out of inodes (files), not "
        f"space: {free_files:,} of its 1,000,000 files are free, while {free:,} bytes (3.00 GiB) is free"
    )
    assert "Delete files you no longer need there" in message and "write to another file system" in message
    assert [path.name for path in (tmp_path / "checkpoints").iterdir() if "step" in path.name] == ["step-000001"]


def test_no_space_left_with_inodes_to_spare_is_named_as_space(tmp_path, monkeypatch):
    checkpointer, model, step = build(tmp_path, "sync")
    monkeypatch.setattr(os, "statvfs", statvfs_with(2**20, 500_000))
    monkeypatch.setattr(trainer_state.dcp, "save", no_space)
    with pytest.raises(DiskFullError, match=r"^No space left on the device while writing .*1,048,576 bytes \(0\.00"):
        checkpointer.save(1, model, step, {"index": 1})
