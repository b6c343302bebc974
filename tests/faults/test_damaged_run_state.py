"""A damaged or hand-edited checkpoint is refused before anything of the run is written, naming what is wrong, and
its message gives the flags that resume from the newest earlier checkpoint that passes its checks. Pruning
(``keep_last``) counts only checkpoints that pass their checks, sets a damaged one aside rather than delete a good
one for it, and never follows a linked step folder to delete; a linked ``model/`` is refused at start.

The checkpoints are a real run's (three steps, one checkpoint a step); each test alters a copy the way a bad disk
or a hand edit would, with ``trainer.json``'s manifest and ``COMMITTED`` recomputed where the test needs the
integrity checks to pass (``recommit``), so the refusal is the check under test.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from rich.console import Console

from tests.checkpoint.test_trainer_state import recipe
from tests.data.test_sft_data import _examples as sft_examples
from tests.faults.crafted_checkpoints import recommit
from titanpod.checkpoint import CheckpointError, read_trainer_file
from titanpod.checkpoint.atomic import atomic_directory, remove_leftovers
from titanpod.checkpoint.locations import remove_tree
from titanpod.checkpoint.step_folders import COMMIT_MARKER, TRAINER_FILE
from titanpod.data import PackedBatches
from titanpod.data.images import ImageBatches
from titanpod.data.positions import DataPositionError
from titanpod.data.sft.batches import SFTBatches
from titanpod.graph.config import SEED_MAX
from titanpod.models.field_checks import INT64_MAX
from titanpod.runs import run_pretraining
from titanpod.runs.run_folder import RunFolderError

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


def edit_trainer_file(folder: Path, field: str, value: object) -> None:
    """Set ``field`` (``data.index``, ``step``) of ``folder``'s ``trainer.json`` to ``value``, hashes recomputed."""
    trainer = json.loads((folder / TRAINER_FILE).read_text())
    *path, last = field.split(".")
    target = trainer
    for name in path:
        target = target[name]
    target[last] = value
    (folder / TRAINER_FILE).write_text(json.dumps(trainer, indent=2) + "\n")
    recommit(folder)


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


OUT_OF_RANGE = {
    "data.index 10**9": ("data.index", 10**9, r"it must be 0 to \d+ \(this run's data gives \d+ batches an epoch\)"),
    "data.epoch beyond 64 bits": ("data.epoch", 10**30, rf"it must be at most {INT64_MAX} \(64 bits\)"),
    "data.seed beyond train.seed's range": ("data.seed", 2**40, rf"it must be 0 to {SEED_MAX}, as train\.seed is"),
}
"""A field of ``trainer.json``, a value out of its range (hashes recomputed), and what the refusal says it must be."""


@pytest.mark.parametrize("case", list(OUT_OF_RANGE))
def test_an_out_of_range_trainer_file_is_refused_before_anything_is_written(saved_run, tmp_path, case):
    field, value, expected = OUT_OF_RANGE[case]
    run_dir = copy_of(saved_run, tmp_path)
    newest = step_folder(run_dir, SAVED_STEPS)
    edit_trainer_file(newest, field, value)
    before = files_in(run_dir)
    with pytest.raises(CheckpointError, match=rf"{re.escape(f'{field} is {value}')}; {expected}") as refused:
        run_pretraining(recipe(tmp_path, SAVED_STEPS + 2, every=1, keep_last=0))
    text = str(refused.value)
    assert text.startswith(f"{newest / TRAINER_FILE}: {field} is {value}; it must be ")
    assert f"run the same command with {resume_flags(run_dir, SAVED_STEPS - 1)} " in text
    assert files_in(run_dir) == before  # recipe.json, metrics, checkpoints: nothing written or replaced


MAP_STYLE_LOADERS = {
    "packed tokens": lambda: PackedBatches(torch.arange(200), seq_len=8, batch_size=2),
    "SFT examples": lambda: SFTBatches(sft_examples([3, 5, 2, 7] * 4), seq_len=12, batch_size=2, pad_id=0),
    "images by index": lambda: ImageBatches(lambda index: (torch.zeros(3, 4, 4), ""), list(range(10)), batch_size=2),
}
"""Loaders whose epoch has a known number of batches, each built anew."""


@pytest.mark.parametrize("kind", list(MAP_STYLE_LOADERS))
def test_a_map_style_loader_refuses_a_batch_index_past_its_epoch(kind):
    build = MAP_STYLE_LOADERS[kind]
    state = build().state_dict()
    per_epoch = build().batches_per_epoch
    build().load_state_dict({**state, "index": per_epoch})  # an epoch just finished: the next batch starts another
    with pytest.raises(DataPositionError, match=rf"^index is {per_epoch + 1}; it must be 0 to {per_epoch} "):
        build().load_state_dict({**state, "index": per_epoch + 1})


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


def run_said(recipe_: object) -> tuple[object, str]:
    """``run_pretraining(recipe_)`` and what it said (its console's text, one line a message)."""
    said = io.StringIO()
    result = run_pretraining(recipe_, Console(file=said, width=2000))
    return result, said.getvalue()


def test_keep_last_sets_a_damaged_newer_checkpoint_aside_and_never_deletes_a_good_one_for_it(saved_run, tmp_path):
    run_dir = copy_of(saved_run, tmp_path)
    damaged = step_folder(run_dir, 3)
    flip_a_byte(damaged)
    damaged_files = files_in(damaged)
    # Recovered as the refusal says: resumed from step 1, stopped after step 2, keeping two checkpoints.
    given = str(step_folder(run_dir, 1))
    _, said = run_said(recipe(tmp_path, SAVED_STEPS, stop_at=2, every=1, keep_last=2, resume=given))
    (aside,) = run_dir.glob("checkpoints/step-000003.damaged-*")
    assert not damaged.exists() and files_in(aside) == damaged_files  # moved whole, nothing deleted
    assert f"checkpoint {damaged} fails its checks (The checkpoint {damaged} is damaged: state/" in said
    assert f"moved it aside to {aside}; it is kept, and keep_last counts only checkpoints that pass" in said
    for step in (1, 2):  # the two good ones are what keep_last kept
        read_trainer_file(step_folder(run_dir, step))


def test_keep_last_never_follows_a_linked_step_folder_to_delete(saved_run, tmp_path):
    run_dir = copy_of(saved_run, tmp_path)
    outside = tmp_path / "elsewhere" / "step-000001"
    outside.parent.mkdir()
    step_folder(run_dir, 1).rename(outside)
    step_folder(run_dir, 1).symlink_to(outside, target_is_directory=True)
    outside_files = files_in(outside)
    _, said = run_said(recipe(tmp_path, SAVED_STEPS + 1, every=1, keep_last=1))
    assert files_in(outside) == outside_files  # COMMITTED too: nothing deleted through the link
    assert step_folder(run_dir, 1).is_symlink()
    assert f"checkpoint {step_folder(run_dir, 1)} is a symbolic link: keep_last neither counts it nor deletes" in said
    assert not step_folder(run_dir, 2).exists() and not step_folder(run_dir, 3).exists()  # pruned as ever
    read_trainer_file(step_folder(run_dir, SAVED_STEPS + 1))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(step_folder(run_dir, 1)))} is a symbolic link"):
        remove_tree(step_folder(run_dir, 1), first=COMMIT_MARKER)
    assert files_in(outside) == outside_files


def test_a_linked_model_folder_is_refused_at_start_and_the_run_goes_on_once_the_link_is_removed(saved_run, tmp_path):
    run_dir = copy_of(saved_run, tmp_path)
    outside = tmp_path / "elsewhere" / "model"
    outside.parent.mkdir()
    (run_dir / "model").rename(outside)
    (run_dir / "model").symlink_to(outside, target_is_directory=True)
    before, outside_files = files_in(run_dir), files_in(outside)
    with pytest.raises(RunFolderError) as refused:
        run_pretraining(recipe(tmp_path, SAVED_STEPS + 1, every=1))
    assert str(refused.value) == (
        f"{run_dir / 'model'} is a symbolic link (to {outside}): a run writes its final weights into a folder of its "
        f"own, never through a link. Remove the link (rm {run_dir / 'model'}; what it points to is kept) or choose "
        "another --output.run-name. Nothing was trained or written."
    )
    assert files_in(run_dir) == before and files_in(outside) == outside_files
    (run_dir / "model").unlink()  # the fix the refusal gives
    result = run_pretraining(recipe(tmp_path, SAVED_STEPS + 1, every=1))
    assert result.weights_path == run_dir / "model" / "model.safetensors" and result.weights_path.is_file()
    assert files_in(outside) == outside_files
    assert not list(run_dir.glob(".model.*"))


def test_a_linked_folder_left_set_aside_is_unlinked_or_put_back_never_deleted_through(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "model.safetensors").write_bytes(b"weights kept elsewhere")
    run_dir = tmp_path / "run"
    (run_dir / "model").mkdir(parents=True)
    aside = run_dir / ".model.replaced-4242"
    aside.symlink_to(outside, target_is_directory=True)
    assert remove_leftovers(run_dir) == [
        f"removed the link {aside} to {outside} left by process 4242; what it points to is kept"
    ]
    assert not aside.is_symlink() and (outside / "model.safetensors").read_bytes() == b"weights kept elsewhere"
    (run_dir / "model").rmdir()
    aside.symlink_to(outside, target_is_directory=True)
    remove_leftovers(run_dir)  # the swap was cut short: the link is put back as model/
    assert (run_dir / "model").is_symlink() and (run_dir / "model").resolve() == outside.resolve()


def test_a_write_into_a_linked_folder_writes_into_what_it_points_to(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "weights.bin").write_bytes(b"old")
    final = tmp_path / "model"
    final.symlink_to(outside, target_is_directory=True)
    with atomic_directory(final) as staging:
        (staging / "weights.bin").write_bytes(b"new")
    assert final.is_symlink() and (outside / "weights.bin").read_bytes() == b"new"
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []
