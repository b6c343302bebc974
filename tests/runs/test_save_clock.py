"""``checkpoint.every_seconds``: a save once that many seconds have passed since the first step or the last save,
after the same step on every process of a job."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.apps.test_pretrain_cli import SHORT_RUN, pretrain
from titanpod.checkpoint import CheckpointConfig
from titanpod.device import get_backend
from titanpod.graph.stop_agreement import StopAgreement
from titanpod.runs.save_clock import SaveClock


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_save_is_due_once_the_seconds_have_passed_since_the_first_step_or_the_last_save():
    clock = FakeClock()
    saves = SaveClock(60.0, StopAgreement(get_backend("cpu")), clock)
    assert not saves.due()  # after the first step: the clock starts here
    clock.now += 59.0
    assert not saves.due()
    clock.now += 1.0
    assert saves.due()
    saves.saved()
    clock.now += 30.0
    assert not saves.due()
    clock.now += 30.0
    assert saves.due()


class NoAgreement(StopAgreement):
    def largest(self, value: int) -> int:
        raise AssertionError("a clock that is off agrees nothing with the other processes")


def test_at_zero_no_save_is_ever_due_and_nothing_is_agreed():
    clock = FakeClock()
    saves = SaveClock(0.0, NoAgreement(get_backend("cpu")), clock)
    clock.now += 1e9
    assert not saves.due()


@pytest.mark.parametrize(
    ("seconds", "message"),
    [(-1.0, "must be at least 0, got -1.0"), (float("nan"), "must be a finite number"), ("10", "must be a number")],
)
def test_a_time_that_is_no_interval_is_refused_naming_the_field(seconds, message):
    with pytest.raises(ValueError, match=r"^checkpoint\.every_seconds " + message):
        CheckpointConfig(every_seconds=seconds)


LATE_RANK, LATE_AT = 1, 3


def rank_main(rank: int, store_path: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    clock = FakeClock()
    saves = SaveClock(10.0, StopAgreement(get_backend("cpu")), clock)
    saved_after = []
    for step in range(1, 6):
        clock.now += 20.0 if (rank == LATE_RANK and step == LATE_AT) else 1.0  # one process's step ran long
        if saves.due():
            saves.saved()
            saved_after.append(step)
    results[rank] = saved_after
    dist.destroy_process_group()


def test_every_process_saves_after_the_step_where_the_first_of_them_found_a_save_due(tmp_path):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_main, args=(str(tmp_path / "store"), results), nprocs=2, join=True)
        assert dict(results) == {0: [LATE_AT], 1: [LATE_AT]}


def test_a_run_saves_by_time_between_its_interval_checkpoints(tmp_path):
    # Every step of the debug model takes far more than a millisecond: each step after the first is due.
    result = pretrain(*SHORT_RUN, "--checkpoint.every-seconds", "0.001", "--checkpoint.keep-last", "0",
                      "--output.run-name", "timed", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "runs" / "timed"
    saved = sorted(path.parent.name for path in (run_dir / "checkpoints").glob("step-*/COMMITTED"))
    assert saved == [f"step-{step:06d}" for step in range(2, 7)]
    assert json.loads((run_dir / "recipe.json").read_text())["checkpoint"]["every_seconds"] == 0.001
