"""One writer per run directory: a second run of a held run directory is refused, naming the holder; the lock is
given back however a run ends; a lock left by a process that is gone (killed, or a rank 0 that torchrun
restarts) is taken over with a message; one written on another host is refused with the way to clear it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_runs import run_cli
from tests.faults.sessions import open_session, session_recipe
from titanpod.checkpoint import CheckpointConfig, CheckpointError
from titanpod.runs import run_lock
from titanpod.runs.run_lock import LOCK_FILE, RunLock, RunLockedError

HOST = socket.gethostname()


def write_lock(run_dir: Path, pid: int, host: str, since: str = "2020-01-02T03:04:05Z") -> Path:
    """A lock file as a holder of ``run_dir`` writes it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    path.write_text(json.dumps({"pid": pid, "host": host, "since": since}) + "\n")
    return path


def never_a_pid() -> int:
    """A process id no process has: the kernel hands out ids below ``pid_max``."""
    return int(Path("/proc/sys/kernel/pid_max").read_text())


def test_a_second_run_of_a_held_run_directory_is_refused_naming_the_holder(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    holder = RunLock.acquire(run_dir, print)  # another run of the directory (here: another open of the lock)
    try:
        with pytest.raises(RunLockedError) as refused:
            open_session(session_recipe(tmp_path / "runs"))
        assert str(refused.value) == (
            f"{run_dir} is in use by another run: pid {os.getpid()} on {HOST} since {holder.holder.since} "
            f"(lock file {run_dir / LOCK_FILE}). Wait for it to end, or choose another --output.run-name."
        )
        assert sorted(path.name for path in run_dir.iterdir()) == [LOCK_FILE]  # the refused run wrote nothing
    finally:
        holder.release()
    session, _ = open_session(session_recipe(tmp_path / "runs"))
    with session:
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (run_dir / LOCK_FILE).exists()


def test_the_lock_is_given_back_when_the_run_fails(tmp_path):
    session, _ = open_session(session_recipe(tmp_path / "runs"))
    with pytest.raises(RuntimeError, match="a step failed"), session:
        raise RuntimeError("a step failed")
    assert not (tmp_path / "runs" / "run" / LOCK_FILE).exists()
    session, _ = open_session(session_recipe(tmp_path / "runs"))  # the next run of the directory opens it
    with session:
        assert session.lock is not None and session.lock.held


def test_the_lock_is_given_back_when_the_session_is_refused_after_taking_it(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    (run_dir / "checkpoints" / "step-000002").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        open_session(session_recipe(tmp_path / "runs", checkpoint=CheckpointConfig(resume="never")))
    assert not (run_dir / LOCK_FILE).exists()
    RunLock.acquire(run_dir, print).release()  # nobody holds it


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_message(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    dead = never_a_pid()
    write_lock(run_dir, dead, HOST)
    session, said = open_session(session_recipe(tmp_path / "runs"))
    with session:
        assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert (
        f"took over the lock of {run_dir} from pid {dead} on {HOST} since 2020-01-02T03:04:05Z: that process is gone"
        in said.getvalue()
    )


def test_a_lock_of_another_host_is_refused_with_the_way_to_clear_it(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    path = write_lock(run_dir, os.getpid(), "other-host")
    with pytest.raises(RunLockedError) as refused:
        open_session(session_recipe(tmp_path / "runs"))
    assert str(refused.value) == (
        f"{run_dir} is in use by another run: pid {os.getpid()} on other-host since 2020-01-02T03:04:05Z "
        f"(lock file {path}). Wait for it to end, or choose another --output.run-name; if other-host is gone and "
        f"that run with it, remove {path}."
    )
    assert json.loads(path.read_text())["host"] == "other-host"  # left as it was


def test_without_flock_a_lock_counts_as_held_while_its_pid_lives(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "_try_flock", lambda descriptor: None)  # a file system without flock
    write_lock(tmp_path, os.getppid(), HOST)  # a live process of this host
    with pytest.raises(RunLockedError, match=rf"in use by another run: pid {os.getppid()} on {HOST} since "):
        RunLock.acquire(tmp_path, print)
    write_lock(tmp_path, never_a_pid(), HOST)
    said: list[str] = []
    RunLock.acquire(tmp_path, said.append).release()
    assert said == [f"took over the lock of {tmp_path} from pid {never_a_pid()} on {HOST} since 2020-01-02T03:04:05Z: "
                    "that process is gone"]  # fmt: skip


@pytest.mark.slow
def test_a_live_holder_in_another_process_is_refused_and_its_lock_taken_over_once_it_is_killed(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hold = (
        "import sys, time; from pathlib import Path; from titanpod.runs.run_lock import RunLock; "
        "lock = RunLock.acquire(Path(sys.argv[1]), print); print('held', flush=True); time.sleep(600)"
    )
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run_dir)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=rf"in use by another run: pid {holder.pid} on {HOST} since "):
            RunLock.acquire(run_dir, print)
    finally:
        holder.kill()  # as a crash would end it, or torchrun before it restarts the job
        holder.wait()
    said: list[str] = []
    lock = RunLock.acquire(run_dir, said.append)  # a new process's rank 0, with no flag
    assert lock.held and len(said) == 1
    assert said[0].startswith(f"took over the lock of {run_dir} from pid {holder.pid} on {HOST} since ")
    lock.release()


@pytest.mark.slow
def test_two_cli_runs_of_one_run_name_at_once_the_second_is_refused_and_the_first_goes_on_alone(tmp_path):
    args = ["--device.lane", "cpu", "--output.runs-dir", str(tmp_path / "runs"), "--output.run-name", "shared",
            "--train.steps", "100000", "--train.log-every", "1", "--output.no-tensorboard"]  # fmt: skip
    metrics = tmp_path / "runs" / "shared" / "metrics.jsonl"
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "titanpod.pretrain.cli", *args], cwd=tmp_path, env=env, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 300
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.5)
        second = run_cli("titanpod.pretrain.cli", args, tmp_path)
        assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-2000:]
        assert f"is in use by another run: pid {first.pid} on {HOST} since " in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)  # the first run stops at the end of its step, saving its checkpoint
        code = first.wait(timeout=300)
    assert code == 128 + signal.SIGTERM, (tmp_path / "first.log").read_text()[-3000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"loss"' in line]
    assert steps == list(range(1, len(steps) + 1))  # one run's reports, none of the refused one's
    assert not (tmp_path / "runs" / "shared" / LOCK_FILE).exists()
