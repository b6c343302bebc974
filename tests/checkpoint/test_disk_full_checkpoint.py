"""A full disk during a trainer-state save names the folder and the bytes; the partial folder goes, earlier
checkpoints stay whole."""

from __future__ import annotations

import errno
from concurrent.futures import Future

import pytest
import torch

from titanpod.checkpoint import CheckpointConfig, Checkpointer, complete_checkpoints, read_trainer_file
from titanpod.checkpoint import trainer_state as trainer_state_module
from titanpod.checkpoint.disk_space import DiskFullError
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, build_step
from titanpod.models import DecoderArgs, Transformer

ARGS = DecoderArgs(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=48)


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("async_save", [False, True])
def test_a_full_disk_during_a_checkpoint_save_is_named_and_cleaned_up(tmp_path, monkeypatch, async_save):
    with torch.device("meta"):
        model = Transformer(ARGS)
    model.to_empty(device="cpu")
    model.init_weights(0)
    step = build_step(model, TrainConfig(steps=5, compiler="none"), get_backend("cpu"))
    checkpointer = Checkpointer(tmp_path, CheckpointConfig(async_save=async_save), "{}", say=lambda _: None)
    checkpointer.save(1, model, step, {"position": 1})
    checkpointer.wait()
    if async_save:

        def failed_future(*args, **kwargs):
            future: Future[None] = Future()
            future.set_exception(OSError(errno.ENOSPC, "No space left on device"))
            return future

        monkeypatch.setattr(trainer_state_module.dcp, "async_save", failed_future)
    else:
        monkeypatch.setattr(trainer_state_module.dcp, "save", no_space)
    with pytest.raises(DiskFullError) as error:
        checkpointer.save(2, model, step, {"position": 2})
        checkpointer.wait()
    message = str(error.value)
    needed = sum(param.numel() * param.element_size() for param in model.parameters())
    assert "step-000002" in message and "No space left" in message and "bytes" in message
    assert int(message.split(" needs about ")[1].split(" bytes")[0].replace(",", "")) >= needed
    folder = tmp_path / "checkpoints"
    assert sorted(path.name for path in folder.iterdir()) == ["step-000001"]
    assert [number for number, _ in complete_checkpoints(folder)] == [1]
    assert read_trainer_file(folder / "step-000001")["step"] == 1
