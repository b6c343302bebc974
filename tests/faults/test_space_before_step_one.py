"""The disk space a run's saves need is checked before step 1, with a margin: a run that would run out of space at
its first save is refused before any step, naming the folder, the bytes needed and free, and the fix; it leaves
nothing behind, so the same command, once there is room, runs without ``--output.start-over``."""

from __future__ import annotations

import json

from titanpod.pretrain.cli import main
from titanpod.runs import space_check

ARGS = ["--device.lane", "cpu", "--train.steps", "1", "--data.seq-len", "32", "--data.batch-size", "2",
        "--output.run-name", "r", "--output.no-tensorboard"]  # fmt: skip


def test_a_run_without_room_for_its_saves_is_refused_before_step_one_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(space_check, "free_bytes", lambda folder: 1_000_000)  # a disk with 1 MB free
    assert main(ARGS) == 1
    error = " ".join(capsys.readouterr().err.split())
    assert "Not enough disk space for this run's saves: a checkpoint " in error
    assert "in runs/r/checkpoints, the final weights " in error
    assert "and 0.00 GiB (1,000,000 bytes) is free there. Nothing was trained or written." in error
    assert "--output.start-over" not in error
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["runs"]

    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(ARGS) == 0  # room again: the same command trains, with no flag
    rows = [json.loads(line) for line in (tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == [1]


def test_the_needs_of_one_disk_add_up_and_a_disk_with_room_passes(tmp_path, monkeypatch):
    needs = [space_check.SpaceNeed(tmp_path, "a checkpoint", 600), space_check.SpaceNeed(tmp_path, "weights", 500)]
    wanted = 1100 + space_check.SPACE_FLOOR
    monkeypatch.setattr(space_check, "free_bytes", lambda folder: wanted)
    space_check.check_space(needs)
    monkeypatch.setattr(space_check, "free_bytes", lambda folder: wanted - 1)
    try:
        space_check.check_space(needs)
    except space_check.NotEnoughSpaceError as error:
        assert f"a checkpoint 0.00 GiB (600 bytes) in {tmp_path}, weights 0.00 GiB (500 bytes) in {tmp_path}" in str(
            error
        )
    else:
        raise AssertionError("a disk one byte short passed")
