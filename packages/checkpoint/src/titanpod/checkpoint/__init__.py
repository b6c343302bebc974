"""titanpod.checkpoint: weights and trainer state on disk, written atomically."""

from titanpod.checkpoint.atomic import atomic_directory
from titanpod.checkpoint.errors import CheckpointMismatchError
from titanpod.checkpoint.weights import WEIGHTS_FILE, load_weights, save_weights

__all__ = ["WEIGHTS_FILE", "CheckpointMismatchError", "atomic_directory", "load_weights", "save_weights"]
