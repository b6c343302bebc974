"""A run refused before it is accepted (before ``resume`` returns: a refused checkpoint, too little space) leaves
nothing behind: no run directory it made, and in a folder that was there no ``recipe.json``, ``metrics.jsonl``,
TensorBoard file or checkpoint folder; so the same command is not refused next time for an earlier run's files."""

from __future__ import annotations

import pytest

from tests.faults.sessions import open_session, session_recipe


def files_under(folder):
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*"))


def test_a_run_refused_before_it_is_accepted_removes_the_run_directory_it_made(tmp_path):
    session, _ = open_session(session_recipe(tmp_path / "runs", tensorboard=True))
    with pytest.raises(ValueError, match="refused"), session:
        raise ValueError("refused")
    assert files_under(tmp_path) == ["runs"]


def test_a_run_refused_in_a_folder_that_was_there_leaves_no_file_in_it(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("mine")
    session, _ = open_session(session_recipe(tmp_path / "runs", tensorboard=True))
    with pytest.raises(ValueError, match="refused"), session:
        raise ValueError("refused")
    assert files_under(tmp_path) == ["runs", "runs/run", "runs/run/notes.txt"]
    session, _ = open_session(session_recipe(tmp_path / "runs"))  # the same command again is not refused
    with session:
        pass
