"""A resumed run draws the random numbers the uninterrupted run would have: the checkpoint holds the generators
as they were after its step, restored after everything that draws at start-up (nothing titanpod runs between
the restore and the next step draws from them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from tests.cli_runs import run_cli
from titanpod.checkpoint import CheckpointConfig, complete_checkpoints
from titanpod.checkpoint.dcp_reader import quiet_single_process, safe_reader, tensor_shapes
from titanpod.checkpoint.rng_state import rng_like
from titanpod.checkpoint.trainer_state import Checkpointer
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, build_step, train

STEPS, STOPPED_AT = 6, 3
RECIPE = {"name": "rng"}


class Dropped(nn.Module):
    """A regression through dropout: every step draws its mask from the CPU generator."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ((self.drop(self.proj(inputs)) - targets) ** 2).mean()


def batches(start: int):
    """The batches from step ``start + 1`` on, each made from its own index (so a resumed run gets the same)."""
    index = start
    while True:
        generator = torch.Generator().manual_seed(index)
        inputs = torch.randn(4, 8, generator=generator)
        yield {"inputs": inputs, "targets": inputs.flip(1)}
        index += 1


def a_process(config: TrainConfig) -> tuple[Dropped, object]:
    """What a new process builds before it trains or resumes: the seed, then the model (whose init draws)."""
    torch.manual_seed(0)
    model = Dropped()
    return model, build_step(model, config, get_backend("cpu"))


def trained(model: Dropped, step: object, config: TrainConfig, start: int = 0) -> None:
    train(model, batches(start), config, get_backend("cpu"), flops_per_token=1.0, step=step, start_step=start,
          count_tokens=lambda batch: batch["inputs"].shape[0])  # fmt: skip


def test_a_run_resumed_with_dropout_draws_as_the_uninterrupted_run(tmp_path):
    config = TrainConfig(steps=STEPS, lr=0.01, warmup_steps=0, log_every=1)
    model, step = a_process(config)
    trained(model, step, config)
    straight_weights, straight_draw = model.proj.weight.detach().clone(), torch.rand(4)

    checkpointer = Checkpointer(tmp_path, CheckpointConfig(), json.dumps(RECIPE), say=lambda _: None)
    first = TrainConfig(steps=STEPS, lr=0.01, warmup_steps=0, log_every=1, stop_at_step=STOPPED_AT)
    model, step = a_process(first)
    trained(model, step, first)
    checkpointer.save(STOPPED_AT, model, step, {"index": STOPPED_AT})
    torch.rand(100)  # what the process draws after its save does not reach the checkpoint

    model, step = a_process(config)
    checkpointer.load(complete_checkpoints(tmp_path / "checkpoints")[-1][1], model, step, RECIPE)
    trained(model, step, config, start=STOPPED_AT)
    assert torch.equal(model.proj.weight.detach(), straight_weights)  # the same dropout masks at steps 4..6
    assert torch.equal(torch.rand(4), straight_draw)


def test_a_checkpoint_holding_a_gpu_generator_loads_on_a_cpu(tmp_path, monkeypatch):
    config = TrainConfig(steps=2, warmup_steps=0)
    model, step = a_process(config)
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(), json.dumps(RECIPE), say=lambda _: None)
    gpu_generator = torch.arange(16, dtype=torch.uint8)
    cpu_state = torch.get_rng_state()
    monkeypatch.setattr(
        "titanpod.checkpoint.trainer_tensors.rng_state",
        lambda _: {"torch_cpu": cpu_state, "cuda": gpu_generator},  # as a run on a GPU saves it
    )
    checkpointer.save(1, model, step, {"index": 1})
    monkeypatch.undo()
    folder = complete_checkpoints(tmp_path / "checkpoints")[-1][1]
    assert set(rng_like(tensor_shapes(folder / "state"))) == {"torch_cpu", "cuda"}
    torch.rand(10)
    model, step = a_process(config)
    checkpointer.load(folder, model, step, RECIPE)
    assert torch.equal(torch.get_rng_state(), cpu_state)


def saved_generator(checkpoint: Path) -> torch.Tensor:
    """The CPU generator a checkpoint folder holds."""
    state = {"rng": rng_like(tensor_shapes(checkpoint / "state"))}
    with quiet_single_process():
        dcp.load(state, storage_reader=safe_reader(checkpoint / "state"))
    return state["rng"]["torch_cpu"]


@pytest.mark.slow
def test_a_stopped_and_resumed_cli_run_saves_the_generator_of_the_uninterrupted_run(tmp_path):
    run = ["--train.steps", "4", "--train.warmup-steps", "1", "--data.seq-len", "32", "--data.batch-size", "2",
           "--output.no-tensorboard", "--output.no-save-weights"]  # fmt: skip
    for args in (["--output.run-name", "straight"], ["--output.run-name", "resumed", "--train.stop-at-step", "2"],
                 ["--output.run-name", "resumed"]):  # fmt: skip
        done = run_cli("titanpod.pretrain.cli", [*run, *args], tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    straight = saved_generator(tmp_path / "runs" / "straight" / "checkpoints" / "step-000004")
    resumed = saved_generator(tmp_path / "runs" / "resumed" / "checkpoints" / "step-000004")
    assert torch.equal(resumed, straight)
    torch.set_rng_state(straight)
    straight_draw = torch.rand(4)
    torch.set_rng_state(resumed)
    assert torch.equal(torch.rand(4), straight_draw)
