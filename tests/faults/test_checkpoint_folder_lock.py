"""One writer per checkpoint folder: two runs given one ``--checkpoint.dir`` (local or on an object store), or a
run whose ``--checkpoint.dir`` is another live run's checkpoints, the second is refused before any work, naming
the first (host, pid, since), and nothing of the first changes: it cannot resume, delete (``keep_last``) or move
aside (``--output.start-over``) the first run's checkpoints. A lock file that is a symbolic link is refused and
what it points to is left as it was."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import fsspec
import pytest

from tests.faults.sessions import open_session, session_recipe
from titanpod.checkpoint import CheckpointConfig
from titanpod.runs.run_lock import LOCK_FILE, RunLockedError

HOST = socket.gethostname()


def snapshot(*folders: Path) -> dict[str, bytes]:
    """Every file under ``folders`` (but the lock files) by path -> its bytes."""
    return {
        str(path): path.read_bytes()
        for folder in folders
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != LOCK_FILE
    }


def a_checkpoint(folder: Path, step: int) -> Path:
    """A complete-looking step folder (as ``keep_last`` and ``start_over`` see one)."""
    step_folder = folder / f"step-{step:06d}"
    (step_folder / "state").mkdir(parents=True)
    (step_folder / "state" / "a").write_bytes(b"weights")
    (step_folder / "trainer.json").write_bytes(b"{}")
    return step_folder


@pytest.mark.parametrize("start_over", [False, True])
def test_a_second_run_on_the_first_runs_checkpoint_folder_is_refused_naming_it_and_nothing_of_it_changes(
    tmp_path, start_over
):
    shared = tmp_path / "shared-checkpoints"
    first, _ = open_session(session_recipe(tmp_path / "runs", "first", CheckpointConfig(dir=str(shared))))
    with first:
        a_checkpoint(shared, 2)
        before = snapshot(tmp_path)
        holder = first.lock.locks[1].holder if first.lock is not None else None
        assert holder is not None
        second = session_recipe(tmp_path / "runs", "second", CheckpointConfig(dir=str(shared)), start_over=start_over)
        with pytest.raises(RunLockedError) as refused:
            open_session(second)
        assert str(refused.value) == (
            f"The checkpoint folder {shared} is in use by another run: pid {os.getpid()} on {HOST} since "
            f"{holder.since} (lock file {shared / LOCK_FILE}). Wait for it to end, or choose another --checkpoint.dir."
        )
        assert snapshot(tmp_path) == before  # nothing of the first run moved, deleted or written
        assert not (tmp_path / "runs" / "second").exists()  # and the refused run left nothing
        assert json.loads((shared / LOCK_FILE).read_text())["since"] == holder.since
    assert not (shared / LOCK_FILE).exists()


def test_a_run_whose_checkpoint_dir_is_another_live_runs_checkpoints_is_refused(tmp_path):
    first, _ = open_session(session_recipe(tmp_path / "runs", "first"))
    theirs = tmp_path / "runs" / "first" / "checkpoints"
    refusal = rf"^The checkpoint folder {theirs} is in use by another run: pid "
    with first, pytest.raises(RunLockedError, match=refusal):
        open_session(session_recipe(tmp_path / "runs", "second", CheckpointConfig(dir=str(theirs))))
    second, _ = open_session(session_recipe(tmp_path / "runs", "second", CheckpointConfig(dir=str(theirs))))
    with second:  # once the first run has ended, the folder is free
        assert second.lock is not None and second.lock.held


def test_a_checkpoint_folder_on_an_object_store_is_locked_by_an_object(tmp_path):
    url = "memory://titanpod-lock-test/checkpoints"
    first, _ = open_session(session_recipe(tmp_path / "runs", "first", CheckpointConfig(dir=url)))
    store = fsspec.filesystem("memory")
    with first:
        holder = json.loads(store.cat_file(f"{url.removeprefix('memory://')}/{LOCK_FILE}"))
        assert (holder["pid"], holder["host"]) == (os.getpid(), HOST)
        with pytest.raises(RunLockedError) as refused:
            open_session(session_recipe(tmp_path / "runs", "second", CheckpointConfig(dir=url)))
        refusal = str(refused.value)
        assert f"The checkpoint folder {url} is in use by another run: pid {os.getpid()} on {HOST}" in refusal
        assert str(refused.value).endswith(f"if that run is gone, remove {url}/{LOCK_FILE}.")
    assert not store.exists(f"{url.removeprefix('memory://')}/{LOCK_FILE}")


def test_a_lock_object_of_a_gone_process_of_this_host_is_taken_over(tmp_path):
    url = "memory://titanpod-stale-lock/checkpoints"
    store = fsspec.filesystem("memory")
    gone = int(Path("/proc/sys/kernel/pid_max").read_text())
    store.pipe_file(f"/titanpod-stale-lock/checkpoints/{LOCK_FILE}", json.dumps(
        {"pid": gone, "host": HOST, "since": "2020-01-02T03:04:05Z"}).encode())  # fmt: skip
    session, said = open_session(session_recipe(tmp_path / "runs", "run", CheckpointConfig(dir=url)))
    with session:
        assert f"took over the lock of {url} from pid {gone} on {HOST}" in said.getvalue()


def test_a_lock_file_that_is_a_symbolic_link_is_refused_and_its_target_left_as_it_was(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"not the run's")
    (run_dir / LOCK_FILE).symlink_to(precious)
    with pytest.raises(RunLockedError) as refused:
        open_session(session_recipe(tmp_path / "runs"))
    assert str(refused.value) == (
        f"{run_dir / LOCK_FILE} is a symbolic link (to {precious}): a run makes its lock file itself and never "
        f"writes through a link. Remove {run_dir / LOCK_FILE} (the link only, not what it points to) and start again."
    )
    assert precious.read_bytes() == b"not the run's"
    assert (run_dir / LOCK_FILE).is_symlink()
