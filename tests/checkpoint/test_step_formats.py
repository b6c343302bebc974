"""The checkpointer saves what a step declares (``TrainStep.state_format``), in the layout checkpoints always had.

A torch step's ``state/`` holds the model under ``model.<name>``, the step's AdamW state under
``optim.step``, ``optim.exp_avg.<name>`` and ``optim.exp_avg_sq.<name>``, and the CPU random
state under ``rng.torch_cpu``; loading it into a fresh step restores every tensor bit for bit.
A step that declares a format the checkpointer does not save is refused by name.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from tests.graph.test_step_modes import BACKEND, random_batches, tiny_model
from titanpod.checkpoint import CheckpointConfig, Checkpointer, CheckpointError
from titanpod.checkpoint.dcp_reader import tensor_shapes
from titanpod.graph import EagerStep, TrainConfig

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def trained_step() -> EagerStep:
    step = EagerStep(tiny_model(), TrainConfig(), BACKEND)
    batches = random_batches(64)
    for _ in range(2):
        step([next(batches)], 1e-3)
    return step


def test_a_torch_step_is_saved_in_the_dcp_layout_and_loads_back_exactly(tmp_path):
    step = trained_step()
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(), "{}", lambda _: None)
    checkpointer.save(2, step.model, step, {"index": 2})
    folder = tmp_path / "checkpoints" / "step-000002"
    names = [name for name, _ in step.model.named_parameters()]
    expected = {"rng.torch_cpu", "optim.step"} | {
        f"{part}.{name}" for name in names for part in ("model", "optim.exp_avg", "optim.exp_avg_sq")
    }
    assert set(tensor_shapes(folder / "state")) == expected
    assert not (folder / "orbax").exists()

    fresh = EagerStep(tiny_model(), TrainConfig(), BACKEND)
    point = checkpointer.load(folder, fresh.model, fresh, {})
    assert point.step == 2 and point.data_state == {"index": 2}
    assert all(torch.equal(a, b) for a, b in zip(fresh.model.parameters(), step.model.parameters(), strict=True))
    for key in ("exp_avg", "exp_avg_sq"):
        assert all(torch.equal(fresh.state_dict()[key][n], step.state_dict()[key][n]) for n in names)
    assert float(fresh.state_dict()["step"]) == 2.0


class UndeclaredFormatStep(EagerStep):
    """A step whose state would need a format the checkpointer does not write."""

    state_format: ClassVar = "numpy"  # type: ignore[assignment]


def test_a_step_of_another_state_format_is_refused_by_name(tmp_path):
    step = UndeclaredFormatStep(tiny_model(), TrainConfig(), BACKEND)
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(), "{}", lambda _: None)
    with pytest.raises(CheckpointError, match=r"UndeclaredFormatStep declares state_format='numpy'"):
        checkpointer.save(1, step.model, step, {})
