"""Never mix two runs in one folder: a run that does not resume is refused where an earlier run left its weights,
metrics or checkpoints, unless it starts over (which moves them aside, deleting nothing); what killed writes left
is cleared at the next start; an unwritable checkpoint folder is found before the first step."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli_runs import run_cli
from tests.faults.sessions import open_session, session_recipe
from titanpod.checkpoint import CheckpointConfig
from titanpod.checkpoint.atomic import remove_leftovers
from titanpod.runs import run_pretraining
from titanpod.runs.pretrain import with_resume
from titanpod.runs.run_folder import RunFolderError

EARLIER = {
    "metrics.jsonl": b'{"step": 1, "loss": 9.0}\n{"step": 2, "loss": 8.0}\n',
    "model/model.safetensors": b"the earlier run's weights",
    "recipe.json": b'{"name": "earlier"}\n',
}
"""What an earlier run of the folder left, by path."""


def write_files(folder, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def files_in(folder) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def refusal(run_dir, found: str, why: str = "but no complete checkpoint to resume") -> str:
    return (
        f"{run_dir} already holds an earlier run's files ({found}) {why}: name a new run (--output.run-name ...) "
        f"or start over (--output.start-over: they are moved into {run_dir}/previous-<UTC time>/, nothing is deleted)."
    )


def test_a_new_run_is_refused_where_an_earlier_run_left_its_weights_and_metrics(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    write_files(run_dir, EARLIER)
    with pytest.raises(RunFolderError) as refused:
        open_session(session_recipe(tmp_path / "runs"))
    assert str(refused.value) == refusal(run_dir, "metrics.jsonl; model/")
    assert files_in(run_dir) == EARLIER  # nothing written, moved or replaced


def test_a_run_whose_every_trainer_json_was_deleted_is_refused(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    write_files(run_dir, {**EARLIER, "checkpoints/step-000002/state/__0_0.distcp": b"state"})
    with pytest.raises(RunFolderError) as refused:
        open_session(session_recipe(tmp_path / "runs"))
    assert str(refused.value) == refusal(run_dir, "metrics.jsonl; model/; checkpoints step-000002")


@pytest.mark.slow
def test_under_torchrun_the_refusal_stops_every_rank_and_the_folder_is_untouched(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    write_files(run_dir, EARLIER)
    args = ["--output.runs-dir", str(tmp_path / "runs"), "--output.run-name", "run", "--parallel.fsdp", "2",
            "--data.seq-len", "32", "--data.batch-size", "2", "--train.steps", "2"]  # fmt: skip
    done = run_cli("titanpod.pretrain.cli", args, tmp_path, processes=2)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"error: {refusal(run_dir, 'metrics.jsonl; model/')}" in done.stderr
    assert files_in(run_dir) == EARLIER


def test_a_fresh_start_is_refused_where_an_earlier_run_left_its_metrics(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    write_files(run_dir, {"metrics.jsonl": EARLIER["metrics.jsonl"]})
    with pytest.raises(RunFolderError) as refused:
        open_session(session_recipe(tmp_path / "runs", checkpoint=CheckpointConfig(resume="never")))
    assert str(refused.value) == refusal(run_dir, "metrics.jsonl", "and checkpoint.resume is never")


def test_a_run_that_resumes_a_complete_checkpoint_continues_the_folder(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    write_files(run_dir, {**EARLIER, "checkpoints/step-000002/trainer.json": b"{}"})
    session, _ = open_session(session_recipe(tmp_path / "runs"))
    with session:
        assert session.checkpointer.resume_folder() == run_dir / "checkpoints" / "step-000002"


def test_start_over_moves_the_earlier_run_aside_and_keeps_every_file(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    earlier = {**EARLIER, "checkpoints/step-000002/trainer.json": b"{}", "checkpoints/step-000002/state/a": b"s"}
    write_files(run_dir, earlier)
    session, said = open_session(session_recipe(tmp_path / "runs", start_over=True))
    with session:
        assert session.checkpointer.resume_folder() is None  # starts fresh: the earlier checkpoints are aside
    (aside,) = run_dir.glob("previous-*")
    assert files_in(aside) == earlier
    assert f"started over: moved checkpoints, metrics.jsonl, model, recipe.json of {run_dir} into {aside}" in (
        said.getvalue()
    )
    names = sorted(path.name for path in run_dir.iterdir())
    assert names == sorted([aside.name, "checkpoints"])  # this run wrote no line and was never accepted
    assert list((run_dir / "checkpoints").iterdir()) == []  # it held this run's lock while the run lasted


def test_start_over_refuses_to_move_aside_the_checkpoint_it_resumes(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    write_files(run_dir, {**EARLIER, "checkpoints/step-000002/trainer.json": b"{}"})
    checkpoint = CheckpointConfig(resume=str(run_dir / "checkpoints" / "step-000002"))
    with pytest.raises(RunFolderError, match=r"--output.start-over moves the files of .* aside, and checkpoint"):
        open_session(session_recipe(tmp_path / "runs", start_over=True, checkpoint=checkpoint))
    assert files_in(run_dir) == {**EARLIER, "checkpoints/step-000002/trainer.json": b"{}"}


def test_resume_and_start_over_together_are_refused():
    recipe = session_recipe(Path("runs"), start_over=True)
    with pytest.raises(ValueError, match=r"--resume continues a run and --output.start-over moves its files aside"):
        with_resume(recipe)


def test_staging_folders_left_by_a_killed_write_are_removed_at_the_next_start(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    write_files(run_dir, {".model.partial-4242/model.safetensors": b"half", ".hf.partial-4243/config.json": b"{"})
    session, said = open_session(session_recipe(tmp_path / "runs"))
    with session:
        assert not [path.name for path in run_dir.iterdir() if ".partial-" in path.name]
    assert f"removed {run_dir / '.model.partial-4242'}: an unfinished write left by process 4242" in said.getvalue()
    assert f"removed {run_dir / '.hf.partial-4243'}: an unfinished write left by process 4243" in said.getvalue()


def test_a_folder_a_killed_replacement_set_aside_is_put_back_or_removed(tmp_path):
    write_files(tmp_path, {".model.replaced-7/model.safetensors": b"old", ".hf.replaced-8/a": b"old", "hf/a": b"new"})
    said = remove_leftovers(tmp_path)
    assert files_in(tmp_path) == {"model/model.safetensors": b"old", "hf/a": b"new"}
    assert said == [
        f"removed {tmp_path / '.hf.replaced-8'}: the earlier copy of a finished replacement left by process 8",
        f"put {tmp_path / '.model.replaced-7'} back as {tmp_path / 'model'}: its replacement was cut short (process 7)",
    ]


def unwritable_folder(tmp_path):
    """A folder no file can be created in, and the reason the error gives: read-only by its mode, or for root (whom
    modes do not stop) a path under a file."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o555)
        return folder, "Permission denied"
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return blocker / "checkpoints", f"{blocker} is a file, not a folder"


def test_an_unwritable_checkpoint_folder_is_refused_before_the_first_step(tmp_path):
    folder, reason = unwritable_folder(tmp_path)
    recipe = session_recipe(tmp_path / "runs", checkpoint=CheckpointConfig(dir=str(folder)))
    with pytest.raises(OSError) as refused:
        run_pretraining(recipe)
    assert str(refused.value) == (
        f"Cannot write the checkpoint folder {folder}: {reason}. Make it writable, or choose another with "
        "--checkpoint.dir."
    )
    assert not (tmp_path / "runs").exists()  # no step trained, nothing written
