"""titanpod.checkpoint: weights on disk, written atomically; Hugging Face checkpoints in and out."""

from titanpod.checkpoint.atomic import atomic_directory
from titanpod.checkpoint.errors import CheckpointMismatchError
from titanpod.checkpoint.hf_files import LoadedCheckpoint, load_hf_checkpoint, save_hf_checkpoint
from titanpod.checkpoint.hub import pull, push, resolve_source
from titanpod.checkpoint.model_files import MODEL_FILE, load_model, save_model
from titanpod.checkpoint.orbax_state import dcp_to_orbax, load_dcp_state, orbax_to_dcp
from titanpod.checkpoint.trainer_state import (
    CheckpointConfig,
    Checkpointer,
    CheckpointError,
    ResumePoint,
    complete_checkpoints,
    read_trainer_file,
    trainer_state_dict,
)
from titanpod.checkpoint.weights import WEIGHTS_FILE, load_weights, save_weights

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
