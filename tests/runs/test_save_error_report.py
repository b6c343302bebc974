"""An error a save raises is reported while the save still holds SIGTERM back: when a rank is lost, torchrun's agent
stops the survivors with SIGTERM moments after their collective fails, and the survivor must name the lost rank
first (tests/faults/test_full_disk_on_rank0.py lost that message once, to a SIGTERM that came after the save let the
signal go and before the report began)."""

from __future__ import annotations

import os
import signal

import pytest

from titanpod.checkpoint import CheckpointConfig, Checkpointer
from titanpod.device import ProcessInfo
from titanpod.recipes import get_recipe
from titanpod.runs.session_saves import RunSaves


def run_saves(tmp_path, report_error) -> RunSaves:
    said: list[str] = []
    checkpointer = Checkpointer(tmp_path / "checkpoints", CheckpointConfig(), "{}", say=said.append)
    return RunSaves(get_recipe("llama3_debug"), checkpointer, tmp_path, ProcessInfo(0, 0, 1), said.append, report_error)


def test_an_error_in_a_save_is_reported_with_sigterm_still_held_back(tmp_path):
    outside: list[int] = []
    seen: list[tuple[Exception, list[int]]] = []

    def report(error: Exception) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the agent's SIGTERM, arriving as the survivor reports
        seen.append((error, list(outside)))

    lost = RuntimeError("Connection closed by peer [127.0.0.1]:29500")
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: outside.append(signum))
    try:
        with pytest.raises(RuntimeError) as raised, run_saves(tmp_path, report).saving_through_a_signal("the weights"):
            raise lost
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert raised.value is lost  # reported, then raised on unchanged
    assert [error for error, _ in seen] == [lost]
    assert seen[0][1] == []  # the SIGTERM did not reach what was there before the save (by default: death)
    assert outside == []  # the save's hold took it as its stop request


def test_a_save_that_completes_reports_nothing(tmp_path):
    reported: list[Exception] = []
    with run_saves(tmp_path, reported.append).saving_through_a_signal("the weights"):
        pass
    assert reported == []
