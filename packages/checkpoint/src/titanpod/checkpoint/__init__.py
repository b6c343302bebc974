"""titanpod.checkpoint: weights on disk, written atomically; Hugging Face checkpoints in and out."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from titanpod.checkpoint.atomic import atomic_directory
    from titanpod.checkpoint.errors import CheckpointMismatchError
    from titanpod.checkpoint.hf_files import LoadedCheckpoint, load_hf_checkpoint, save_hf_checkpoint
    from titanpod.checkpoint.hub import pull, push, resolve_source
    from titanpod.checkpoint.model_files import MODEL_FILE, load_model, save_model
    from titanpod.checkpoint.orbax_state import dcp_to_orbax, load_dcp_state, orbax_to_dcp
    from titanpod.checkpoint.trainer_file import read_trainer_file
    from titanpod.checkpoint.trainer_load import ResumePoint
    from titanpod.checkpoint.trainer_state import CheckpointConfig, Checkpointer, CheckpointError, complete_checkpoints
    from titanpod.checkpoint.trainer_tensors import trainer_state_dict
    from titanpod.checkpoint.weights import WEIGHTS_FILE, load_weights, save_weights

_HOMES = {
    "atomic_directory": "titanpod.checkpoint.atomic",
    "CheckpointMismatchError": "titanpod.checkpoint.errors",
    "LoadedCheckpoint": "titanpod.checkpoint.hf_files",
    "load_hf_checkpoint": "titanpod.checkpoint.hf_files",
    "save_hf_checkpoint": "titanpod.checkpoint.hf_files",
    "pull": "titanpod.checkpoint.hub",
    "push": "titanpod.checkpoint.hub",
    "resolve_source": "titanpod.checkpoint.hub",
    "MODEL_FILE": "titanpod.checkpoint.model_files",
    "load_model": "titanpod.checkpoint.model_files",
    "save_model": "titanpod.checkpoint.model_files",
    "dcp_to_orbax": "titanpod.checkpoint.orbax_state",
    "load_dcp_state": "titanpod.checkpoint.orbax_state",
    "orbax_to_dcp": "titanpod.checkpoint.orbax_state",
    "CheckpointConfig": "titanpod.checkpoint.config",
    "Checkpointer": "titanpod.checkpoint.trainer_state",
    "CheckpointError": "titanpod.checkpoint.trainer_state",
    "ResumePoint": "titanpod.checkpoint.trainer_load",
    "complete_checkpoints": "titanpod.checkpoint.trainer_state",
    "read_trainer_file": "titanpod.checkpoint.trainer_file",
    "trainer_state_dict": "titanpod.checkpoint.trainer_tensors",
    "WEIGHTS_FILE": "titanpod.checkpoint.weights",
    "load_weights": "titanpod.checkpoint.weights",
    "save_weights": "titanpod.checkpoint.weights",
}
"""Where each public name lives: imported on first use, so a module of this package that needs none of them
(a config dataclass the command line reads) is imported without the rest."""

__all__ = [
    "MODEL_FILE",
    "WEIGHTS_FILE",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointMismatchError",
    "Checkpointer",
    "LoadedCheckpoint",
    "ResumePoint",
    "atomic_directory",
    "complete_checkpoints",
    "dcp_to_orbax",
    "load_dcp_state",
    "load_hf_checkpoint",
    "load_model",
    "load_weights",
    "orbax_to_dcp",
    "pull",
    "push",
    "read_trainer_file",
    "resolve_source",
    "save_hf_checkpoint",
    "save_model",
    "save_weights",
    "trainer_state_dict",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'titanpod.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
