"""Never mix, never lose: a step folder without trainer.json is named and kept, ``resume never`` is refused
where checkpoints are, a resume under a recipe that changes the model or the data is refused unless the
change is allowed, and every earlier recipe.json of a run directory is kept."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import fsspec
import pytest
from rich.console import Console

from tests.checkpoint import test_trainer_state
from titanpod.checkpoint import CheckpointConfig, Checkpointer, CheckpointError, complete_checkpoints
from titanpod.checkpoint.recipe_changes import check_same_run
from titanpod.checkpoint.step_folders import set_aside
from titanpod.models.field_checks import same_maths_fields
from titanpod.recipes import Recipe
from titanpod.runs import run_pretraining
from titanpod.runs.resume_check import RunFinished


def recipe(tmp_path, steps: int, **checkpoint) -> Recipe:
    """The tiny recipe of ``test_trainer_state`` in run directory ``run``, without warmup (so one step is a run)
    and final weights (not needed here)."""
    base = test_trainer_state.recipe(tmp_path, max(steps, 3), **checkpoint)
    train = dataclasses.replace(base.train, steps=steps, warmup_steps=0)
    return dataclasses.replace(base, train=train, output=dataclasses.replace(base.output, save_weights=False))


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    """A run directory ``run`` holding the checkpoint of 1 step of the tiny recipe (trained once per module)."""
    root = tmp_path_factory.mktemp("never_mix")
    run_pretraining(recipe(root, 1))
    return root / "runs" / "run"


@pytest.fixture
def trained(tmp_path, one_step):
    """A copy of ``one_step`` under ``tmp_path/runs/run`` (each test changes its own)."""
    shutil.copytree(one_step, tmp_path / "runs" / "run")
    return tmp_path / "runs" / "run"


def changed(base: Recipe, *, allow: tuple[str, ...] = (), **sections: dict) -> Recipe:
    """``base`` with fields of its sections replaced (``train={"lr": 1e-3}``) and ``checkpoint.allow_changes``."""
    replaced = {name: dataclasses.replace(getattr(base, name), **fields) for name, fields in sections.items()}
    checkpoint = dataclasses.replace(base.checkpoint, allow_changes=allow)
    return dataclasses.replace(base, checkpoint=checkpoint, **replaced)


def test_a_step_folder_without_trainer_json_is_named_kept_and_the_newest_complete_one_used(tmp_path, trained, capsys):
    copied = trained / "checkpoints" / "step-000002"
    (copied / "state").mkdir(parents=True)
    (copied / "state" / "__0_0.distcp").write_bytes(b"part of a checkpoint copied by hand")
    result = run_pretraining(recipe(tmp_path, 2, every=1), console=Console(width=400))
    out = capsys.readouterr().out
    assert f"checkpoint {copied} has no trainer.json (not a complete checkpoint); it is left as it is" in out
    assert result.summary.start_step == 1
    moved = list((trained / "checkpoints").glob("step-000002.moved-*"))
    assert len(moved) == 1 and f"moved it aside to {moved[0]}" in out  # the save of step 2 did not overwrite it
    assert (moved[0] / "state" / "__0_0.distcp").read_bytes() == b"part of a checkpoint copied by hand"
    assert [step for step, _ in complete_checkpoints(trained / "checkpoints")] == [1, 2]


def test_set_aside_moves_a_folder_at_a_url_too(tmp_path):
    memory = fsspec.filesystem("memory")
    url = f"memory://titanpod-tests/set-aside-{tmp_path.name}"
    memory.pipe_file(f"{url}/step-000005/COMMITTED", b"{}")  # a marker but no trainer.json
    try:
        said = set_aside(f"{url}/step-000005")
        (moved,) = memory.ls(url, detail=False)
        assert re.fullmatch(r".*/step-000005\.moved-\d{8}T\d{6}Z", moved) and memory.isfile(f"{moved}/COMMITTED")
        assert "(no trainer.json: incomplete); moved it aside to memory://" in said
    finally:
        memory.rm(url, recursive=True)


def test_resume_never_is_refused_where_checkpoints_are_and_fine_in_a_fresh_directory(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    for step in (10, 20, 30, 40):
        (run_dir / "checkpoints" / f"step-0000{step}").mkdir(parents=True)
    with pytest.raises(CheckpointError) as refused:
        run_pretraining(recipe(tmp_path, 3, resume="never"))
    assert str(refused.value) == (
        f"{run_dir} already holds checkpoints (step-000010, step-000020, step-000030, ...): name a new run "
        "(--output.run-name ...), resume them (--checkpoint.resume auto) or start over (--output.start-over: they "
        "are moved into previous-<UTC time>/, nothing is deleted)."
    )
    assert sorted(path.name for path in run_dir.iterdir()) == ["checkpoints"]  # no work done, nothing written
    fresh = tmp_path / "runs" / "fresh"
    Checkpointer(fresh, CheckpointConfig(resume="never"), "{}", print).check_fresh_start(fresh)  # no error


def test_a_resume_that_changes_the_data_or_the_trajectory_is_refused_naming_each_field(tmp_path, trained):
    other = changed(recipe(tmp_path, 5), data={"seq_len": 64}, train={"lr": 1e-3})
    with pytest.raises(CheckpointError) as refused:
        run_pretraining(other)
    message = str(refused.value)
    assert "data.seq_len: 32 -> 64" in message
    assert "train.lr: 0.003 -> 0.001" in message
    assert message.endswith("--checkpoint.allow-changes data.seq_len,train.lr.")
    assert "train.steps" not in message  # extending the run is no difference
    assert json.loads((trained / "recipe.json").read_text())["train"]["lr"] == 0.003  # the refused recipe not written


def test_allowed_changes_resume_and_are_said(tmp_path, trained, capsys):
    other = changed(recipe(tmp_path, 2), allow=("data.*", "train.lr"), data={"seq_len": 64}, train={"lr": 1e-3})
    result = run_pretraining(other, console=Console(width=400))  # one more step, under the changes
    out = capsys.readouterr().out
    assert result.summary.start_step == 1 and result.summary.steps_done == 2
    assert "allowed by --checkpoint.allow-changes): data.seq_len: 32 -> 64" in out
    assert "train.lr: 0.003 -> 0.001" in out
    (kept,) = (trained / "recipe-history").glob("recipe-*.json")  # the recipe the checkpoint was trained with
    assert json.loads(kept.read_text())["train"]["lr"] == 0.003
    assert json.loads((trained / "recipe.json").read_text())["train"]["lr"] == 1e-3


def test_a_finished_run_is_not_trained_again_and_nothing_of_it_changes(tmp_path, trained):
    before = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in trained.rglob("*") if path.is_file()}
    with pytest.raises(RunFinished, match=r"Run run is finished: 1 of 1 steps done .* --train.steps N, with N above 1"):
        run_pretraining(recipe(tmp_path, 1))
    after = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in trained.rglob("*") if path.is_file()}
    assert after == before


def test_a_longer_run_resumes_silently_and_every_earlier_recipe_is_kept(tmp_path, trained, capsys):
    first_recipe = (trained / "recipe.json").read_text()
    result = run_pretraining(recipe(tmp_path, 2), console=Console(width=400))
    out = capsys.readouterr().out
    assert result.summary.start_step == 1 and result.summary.steps_done == 2
    assert "resumed from" in out and "changed recipe field" not in out
    history = list((trained / "recipe-history").glob("recipe-*.json"))
    assert len(history) == 1 and history[0].read_text() == first_recipe
    assert f"the earlier one is kept as {history[0]}" in out
    assert json.loads((trained / "recipe.json").read_text())["train"]["steps"] == 2


def test_allow_changes_must_name_recipe_fields_and_accepts_commas():
    saved = {"name": "r", "data": {"seq_len": 32}, "train": {"steps": 2}}
    assert CheckpointConfig(allow_changes=("data.seq_len, train.lr",)).allow_changes == ("data.seq_len", "train.lr")
    with pytest.raises(CheckpointError, match=r"names 'data.seq_lem', which is no field of this recipe"):
        check_same_run(saved, saved, "here", ("data.seq_lem",))
    added = {**saved, "model": {"dim": 8}}
    with pytest.raises(CheckpointError, match=r"model.dim: <absent> -> 8"):
        check_same_run(saved, added, "here")


def test_a_checkpoint_from_before_optimizer_offload_resumes_with_or_without_it(tmp_path):
    saved = Recipe().to_dict()
    del saved["train"]["optimizer_offload"]  # a recipe.json written before the field existed
    for offload in (False, True):
        current = dataclasses.replace(Recipe(), train=dataclasses.replace(Recipe().train, optimizer_offload=offload))
        assert check_same_run(saved, current.to_dict(), str(tmp_path)) == []


def test_kernel_settings_are_compared_when_they_change_the_maths_and_free_when_they_pick_an_implementation():
    base = Recipe()
    kernels, saved = base.kernels, base.to_dict()
    same = dataclasses.replace(
        kernels,
        attention="math",
        chunk_rows=64,
        splash=dataclasses.replace(kernels.splash, block_q=256, fused_backward=True),
        pallas_loss=dataclasses.replace(kernels.pallas_loss, keep_logits=True),
    )
    free = same_maths_fields(Recipe)  # as a run passes them
    assert check_same_run(saved, dataclasses.replace(base, kernels=same).to_dict(), "here", (), free) == []
    other = dataclasses.replace(kernels, window=4, splash=dataclasses.replace(kernels.splash, causal=False))
    with pytest.raises(CheckpointError) as refused:
        check_same_run(saved, dataclasses.replace(base, kernels=other).to_dict(), "here", (), free)
    assert "kernels.splash.causal: True -> False; kernels.window: None -> 4" in str(refused.value)
