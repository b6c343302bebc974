"""A checkpoint save whose writes fail mid-run is named for what failed and what to do, and the run still leaves
its final weights where it can.

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

from titanpod.checkpoint import trainer_state
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
