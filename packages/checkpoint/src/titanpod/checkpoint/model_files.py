"""A titanpod model checkpoint: ``model.safetensors`` (titanpod names) and ``model.json``
(family and shape), enough to rebuild the model with no recipe at hand."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from titanpod.checkpoint.weights import load_weights, save_weights, stored_dtype
from titanpod.models import Transformer, build_model
from titanpod.models.common.args import args_from_dict, args_to_dict

MODEL_FILE = "model.json"


def save_model(
    model: Transformer,
    family: str,
    directory: Path | str,
    metadata: Mapping[str, object] | None = None,
    extra_files: Mapping[str, str] | None = None,
    overwrite: bool = True,
) -> Path:
    """Write weights and ``model.json`` into ``directory`` atomically; return the weights file.

    A non-empty ``directory`` is refused unless ``overwrite``; then only the files written are replaced
    (``save_weights``). A sharded model is gathered one tensor at a time and written by one process: every process
    of its mesh must call this (see ``save_weights``).
    """
    description = {"family": family, "args": args_to_dict(model.args)}
    files = {MODEL_FILE: json.dumps(description, indent=2) + "\n", **(extra_files or {})}
    return save_weights(model, Path(directory), metadata, extra_files=files, overwrite=overwrite)


def read_model_description(directory: Path | str) -> tuple[str, dict]:
    """The family and args dict from a checkpoint's ``model.json``."""
    path = Path(directory) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"No {MODEL_FILE} in {directory}: not a titanpod model checkpoint.")
    description = json.loads(path.read_text(encoding="utf-8"))
    return description["family"], description["args"]


def load_model(directory: Path | str, device: torch.device | str = "cpu") -> tuple[str, Transformer]:
    """Rebuild the model a checkpoint describes, on ``device``, and load its weights strictly."""
    family, args = read_model_description(directory)
    model = build_model(family, args_from_dict(args))
    model.to_empty(device=device)
    model.to(stored_dtype(Path(directory)))
    load_weights(model, Path(directory))
    return family, model
