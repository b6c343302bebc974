"""The model weights inside a trainer-state checkpoint (``<run>/checkpoints/step-NNNNNN``), read into a model in
one process, whatever mesh saved them: the parameters only, not the optimizer moments.

The checkpoint is checked first (``read_trainer_file``: commit marker, sizes and content hashes), and its DCP
metadata is read with the restricted unpickler (``dcp_reader``). Key accounting is strict: a parameter the
checkpoint lacks, or holds in another shape, is a ``CheckpointMismatchError`` naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from titanpod.checkpoint.dcp_reader import quiet_single_process, safe_reader, tensor_shapes
from titanpod.checkpoint.errors import CheckpointMismatchError
from titanpod.checkpoint.step_folders import TRAINER_FILE, complete_checkpoints
from titanpod.checkpoint.trainer_file import STATE_FOLDER, read_trainer_file

MODEL_KEY = "model"
"""The part of the trainer state that holds the parameters (``trainer_state_dict``)."""


def is_trainer_checkpoint(folder: Path | str) -> bool:
    """Whether ``folder`` looks like a trainer checkpoint (it holds ``trainer.json``)."""
    return (Path(folder) / TRAINER_FILE).is_file()


def newest_trainer_checkpoint(run_dir: Path | str) -> Path | None:
    """The newest complete checkpoint in ``<run_dir>/checkpoints``, or ``None`` when there is none."""
    found = complete_checkpoints(Path(run_dir) / "checkpoints")
    return Path(found[-1][1]) if found else None


def read_trainer_checkpoint(folder: Path | str) -> dict[str, Any]:
    """The checked ``trainer.json`` of a checkpoint (step, data position, recipe), with an error that says what
    to do when the folder holds no torch trainer state."""
    trainer = read_trainer_file(Path(folder))
    if not (Path(folder) / STATE_FOLDER).is_dir():
        raise FileNotFoundError(
            f"{folder} holds no {STATE_FOLDER}/ (torch trainer state); a checkpoint of the xla lane keeps Orbax "
            "state: convert it with titanpod.checkpoint.orbax_state.orbax_to_dcp first."
        )
    return trainer


def _model_entries(folder: Path | str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Parameter name -> (shape, dtype) of the ``model`` entries of a checkpoint's DCP state."""
    shapes = tensor_shapes(Path(folder) / STATE_FOLDER)
    prefix = f"{MODEL_KEY}."
    return {key.removeprefix(prefix): value for key, value in shapes.items() if key.startswith(prefix)}


def trainer_weights_dtype(folder: Path | str) -> torch.dtype:
    """The dtype a checkpoint stores its parameters in: the widest floating one when they mix."""
    dtypes = {dtype for _, dtype in _model_entries(folder).values() if dtype.is_floating_point}
    return max(dtypes, key=lambda dtype: (dtype.itemsize, dtype == torch.float16), default=torch.float32)


def load_trainer_weights(model: nn.Module, folder: Path | str) -> None:
    """Fill ``model`` (materialised, one process) with the parameters a trainer checkpoint holds, in place.

    Only the ``model`` entries are read. Every parameter must be there with its shape, and no other
    parameter may be: else a ``CheckpointMismatchError`` names each difference. The stored dtype is cast to
    the model's.
    """
    state_folder = Path(folder) / STATE_FOLDER
    stored = _model_entries(folder)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(stored))
    unexpected = sorted(set(stored) - set(params))
    misshaped = [
        f"{name}: {tuple(stored[name][0])} stored, {tuple(param.shape)} in the model"
        for name, param in params.items()
        if name in stored and tuple(stored[name][0]) != tuple(param.shape)
    ]
    if missing or unexpected or misshaped:
        raise CheckpointMismatchError(
            f"The trainer checkpoint {folder} does not fit the model its recipe describes: "
            f"missing {missing or 'none'}, unexpected {unexpected or 'none'}, mis-shaped {misshaped or 'none'}."
        )
    buffers = {name: torch.empty(shape, dtype=dtype) for name, (shape, dtype) in stored.items()}
    with quiet_single_process():
        dcp.load({MODEL_KEY: buffers}, storage_reader=safe_reader(state_folder), no_dist=True)
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(buffers[name])
