"""Model weights as safetensors under titanpod's own names, with strict key accounting on load."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from titanpod.checkpoint.atomic import atomic_directory
from titanpod.checkpoint.companion_files import Files, write_files
from titanpod.checkpoint.model_tensors import ModelTensors, identity_layout, is_sharded, writes_here
from titanpod.checkpoint.safetensors_io import (
    TRANSFORMERS_FILES,
    SafetensorsFiles,
    widest_float_dtype,
    write_streamed,
)
from titanpod.checkpoint.safetensors_stream import TensorData, TensorEntry
from titanpod.checkpoint.superseded import previous_weight_files

WEIGHTS_FILE = TRANSFORMERS_FILES.single
"""The one weights file of a titanpod checkpoint folder."""


def _distinct_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers by name; a tied parameter appears once, first name."""
    persistent = set(model.state_dict().keys())
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters())
    tensors.update((name, buf) for name, buf in model.named_buffers() if name in persistent)
    return tensors


class TensorSource(Protocol):
    """Tensors to write that no one process holds (a pipeline's stages): described first, fetched in turn."""

    entries: Sequence[TensorEntry]
    """Every tensor to write, in order."""

    def fetch(self, name: str) -> TensorData | None:
        """The tensor ``name`` on the writing process (``None`` elsewhere); a collective every process calls in
        the order of ``entries``."""
        ...


def _weights_path(path: Path | str) -> Path:
    """``path`` itself, or the weights file inside it when it is a folder."""
    path = Path(path)
    return path / WEIGHTS_FILE if path.is_dir() else path


def save_weights(
    model: nn.Module,
    directory: Path,
    metadata: Mapping[str, object] | None = None,
    extra_files: Files | None = None,
    overwrite: bool = True,
    source: TensorSource | None = None,
) -> Path:
    """Write ``model``'s weights to ``directory/model.safetensors``, atomically; return the file.

    ``metadata`` is stored as JSON strings in the safetensors header; ``extra_files`` maps
    file names to text (or bytes) written beside the weights (a recipe, a config). The directory
    appears only when everything in it is complete. A non-empty ``directory`` is refused unless
    ``overwrite``; then only the files written (and an earlier write's weight files) are replaced,
    other files stay (``atomic_directory``). A full disk is a ``DiskFullError`` naming the folder.

    A sharded model (``DTensor`` parameters) is written without any process holding it whole:
    every process of its mesh must call this, each tensor is gathered in turn on rank 0, which
    streams it into the file (``model_tensors``). Other processes write nothing and get the same
    path back. ``source`` gives the tensors instead of ``model`` (pipeline stages, each on some ranks
    only): every process calls this, and fetches each tensor in turn for the writer.
    """
    header = {key: json.dumps(value) for key, value in (metadata or {}).items()}
    collective = source is not None
    if source is None:
        tensors = _distinct_tensors(model)
        source = ModelTensors(identity_layout(list(tensors)), tensors)
        collective = is_sharded(tensors)
    if not writes_here():
        if collective:  # take part in every gather
            write_streamed(None, source.entries, source.fetch, TRANSFORMERS_FILES, metadata=header)
        return Path(directory) / WEIGHTS_FILE
    needed = sum(entry.nbytes for entry in source.entries)
    superseded = partial(previous_weight_files, TRANSFORMERS_FILES)
    with atomic_directory(Path(directory), overwrite=overwrite, superseded=superseded, needed_bytes=needed) as staging:
        write_streamed(staging, source.entries, source.fetch, TRANSFORMERS_FILES, metadata=header)
        write_files(staging, extra_files or {})
    return Path(directory) / WEIGHTS_FILE


def load_weights(model: nn.Module, path: Path) -> None:
    """Load ``path`` (a ``model.safetensors`` or its directory) into ``model``, strictly.

    Raises ``FileNotFoundError`` for a missing file and ``CheckpointMismatchError`` listing
    every missing, unexpected or mis-shaped tensor before touching the model.
    """
    path = _weights_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No weights at {path}: expected a {WEIGHTS_FILE} written by titanpod.")
    files = SafetensorsFiles.single(path)
    tensors = _distinct_tensors(model)
    files.check(
        {name: tuple(tensor.shape) for name, tensor in tensors.items()},
        f"{path} does not fit the model",
        hint="Check that the recipe's model family and flavor match the ones that wrote it.",
    )
    files.load_into(tensors)


def stored_dtype(path: Path) -> torch.dtype:
    """The floating dtype a ``model.safetensors`` (or its directory) stores: the widest when it mixes."""
    return widest_float_dtype(SafetensorsFiles.single(_weights_path(path)).stored_dtypes())
