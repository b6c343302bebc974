"""A damaged checkpoint is refused with a message that gives the flags that resume from the newest earlier
checkpoint that passes its checks.

The checkpoints are a real run's (three steps, one checkpoint a step); each test alters a copy the way a bad disk
would.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.checkpoint.test_trainer_state import recipe
from titanpod.checkpoint import CheckpointError
from titanpod.runs import run_pretraining

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SAVED_STEPS = 3
"""Steps of the run whose checkpoints (one a step, all kept) the tests alter."""


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A finished run's folder: ``runs/run`` with ``checkpoints/step-000001`` to ``step-000003``."""
    root = tmp_path_factory.mktemp("saved")
    result = run_pretraining(recipe(root, SAVED_STEPS, every=1, keep_last=0))
    return result.run_dir


def copy_of(saved_run: Path, tmp_path: Path) -> Path:
    """This test's own copy of the saved run, as ``tmp_path/runs/run``."""
    run_dir = tmp_path / "runs" / "run"
    shutil.copytree(saved_run, run_dir)
    return run_dir


def step_folder(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def flip_a_byte(folder: Path) -> None:
    """Flip one byte in the middle of the largest tensor file of ``folder``: its size stays, its hash does not."""
    data_file = max((folder / "state").glob("*.distcp"), key=lambda path: path.stat().st_size)
    data = bytearray(data_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    data_file.write_bytes(bytes(data))


def files_in(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def resume_flags(run_dir: Path, step: int) -> str:
    return f"--checkpoint.resume {step_folder(run_dir, step)} --output.run-name {run_dir.name}"


def test_a_damaged_newest_checkpoint_names_the_newest_good_one_to_resume_from(saved_run, tmp_path):
    run_dir = copy_of(saved_run, tmp_path)
    flip_a_byte(step_folder(run_dir, 3))
    flip_a_byte(step_folder(run_dir, 2))  # the next newest is damaged too: step 1 is the newest good one
    with pytest.raises(CheckpointError) as refused:
        run_pretraining(recipe(tmp_path, SAVED_STEPS + 2, every=1, keep_last=0))
    text = str(refused.value)
    assert text.startswith(f"The checkpoint {step_folder(run_dir, 3)} is damaged: state/")
    assert f"the newest that passes its checks is {step_folder(run_dir, 1)}; run the same command with " in text
    assert resume_flags(run_dir, 1) in text

    given = str(step_folder(run_dir, 1))
    resumed = run_pretraining(recipe(tmp_path, SAVED_STEPS, every=SAVED_STEPS, keep_last=0, resume=given))
    assert resumed.run_dir == run_dir and resumed.summary.start_step == 1
    assert resumed.summary.steps_done == SAVED_STEPS  # the flags given resume the run


def test_with_no_good_earlier_checkpoint_the_message_says_so(saved_run, tmp_path):
    run_dir = copy_of(saved_run, tmp_path)
    for step in range(1, SAVED_STEPS + 1):
        flip_a_byte(step_folder(run_dir, step))
    with pytest.raises(CheckpointError) as refused:
        run_pretraining(recipe(tmp_path, SAVED_STEPS + 2, every=1, keep_last=0))
    assert (
        f"No earlier checkpoint in {run_dir / 'checkpoints'} passes its checks: resume from another checkpoint "
        "(--checkpoint.resume PATH) or start a new run (--output.run-name NEW)." in str(refused.value)
    )
