"""SIGKILL at 20 seeded points of a trainer-state save (10 synchronous, 10 in the background).

After each kill the checkpoint folder is opened as the next run would open it: the unfinished
save is removed, the newest complete checkpoint is the one the killed save was writing (if it
finished before the kill) or the one before, and every complete checkpoint loads with exactly the
values of its own step. Nothing a kill interrupts damages an earlier checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from titanpod.checkpoint import complete_checkpoints

WORKER = Path(__file__).with_name("kill_worker.py")
SEEDS = list(range(10))


def killed_saves(root: Path, mode: str) -> list[dict]:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(WORKER), str(root), mode, *map(str, SEEDS)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_save_killed_anywhere_leaves_every_complete_checkpoint_whole(tmp_path, mode):
    sys.path.insert(0, str(WORKER.parent))
    try:
        from kill_worker import KILLED_STEP, build
    finally:
        sys.path.pop(0)
    trials = killed_saves(tmp_path, mode)
    assert [trial["seed"] for trial in trials] == SEEDS
    assert sum(trial["killed"] for trial in trials) >= len(SEEDS) - 1  # a seed may land past the last call
    for trial in trials:
        root = tmp_path / str(trial["seed"])
        assert trial["saved"] == [1, 2], trial
        checkpointer, model, step = build(root, mode)
        checkpointer.remove_partial()
        found = complete_checkpoints(root / "checkpoints")
        steps = [number for number, _ in found]
        assert steps[-1] in (2, KILLED_STEP), trial
        assert not [p for p in (root / "checkpoints").iterdir() if p.name.startswith(".")], trial
        for number, folder in found:
            point = checkpointer.load(folder, model, step, {"name": "faults"})
            assert point.step == number and point.data_state == {"index": number}, trial
            for parameter in model.parameters():
                assert torch.equal(parameter.detach(), torch.full_like(parameter, float(number))), (trial, number)
