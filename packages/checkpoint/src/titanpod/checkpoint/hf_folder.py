"""A model in Hugging Face form on disk: config.json plus safetensors, through a family's
state-dict adapter (``titanpod.models.adapters``). Every family's loader and saver is this
one check-and-load path with its own file names and defaults.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from titanpod.checkpoint.atomic import atomic_directory
from titanpod.checkpoint.companion_files import Files, write_files
from titanpod.checkpoint.model_tensors import ModelTensors, is_sharded, writes_here
from titanpod.checkpoint.safetensors_io import (
    Progress,
    SafetensorsFiles,
    WeightFileNames,
    check_writable_dtype,
    widest_float_dtype,
    write_streamed,
)
from titanpod.checkpoint.superseded import previous_weight_files
from titanpod.models.adapters import StateDictAdapter, UnsupportedConfigError

CONFIG_FILE = "config.json"
"""The model description beside the weights of a Hugging Face model folder."""


def read_hf_config(directory: Path | str) -> tuple[str, dict[str, Any]]:
    """The path and parsed config.json of a model folder, with errors that name the file."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"No {CONFIG_FILE} in {directory}: not a Hugging Face checkpoint directory.")
    try:
        return str(path), json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


@contextmanager
def config_errors_named(path: str) -> Iterator[None]:
    """Re-raise an ``UnsupportedConfigError`` (of the same class) with ``path`` in front of its message."""
    try:
        yield
    except UnsupportedConfigError as error:
        raise type(error)(f"{path}: {error}") from error


def load_adapted(
    model: nn.Module,
    adapter: StateDictAdapter[Any],
    files: SafetensorsFiles,
    subject: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    progress: Progress | None = None,
) -> None:
    """Fill ``model``, built on the meta device, from ``files`` in ``adapter``'s names.

    Every stored name and shape is checked from the headers first (a ``CheckpointMismatchError``
    names what is missing, unexpected or mis-shaped; ``subject`` says what the folder should
    hold, e.g. ``FLUX transformer``). Then the model is materialised once on ``device`` in
    ``dtype`` (default: the widest dtype stored) and filled tensor by tensor.
    """
    params = dict(model.named_parameters())
    sources = {name: f"titanpod {slot.describe()}" for name, slot in adapter.hf_layout(model.args).items()}
    stored = files.check(
        adapter.hf_shapes(params, model.args),
        f"{files.directory} does not fit the {subject} its config.json describes",
        sources,
    )
    model.to(dtype or widest_float_dtype(stored))
    model.to_empty(device=device)
    files.load_into(dict(adapter.to_hf(dict(model.named_parameters()), model.args)), progress)


def save_adapted(
    model: nn.Module,
    adapter: StateDictAdapter[Any],
    directory: Path | str,
    names: WeightFileNames,
    max_shard_bytes: int | str,
    dtype: torch.dtype,
    progress: Progress | None = None,
    overwrite: bool = True,
    config_extra: dict[str, Any] | None = None,
    extra_files: Files | None = None,
) -> Path:
    """Write ``model`` in ``adapter``'s form: config.json and safetensors in ``dtype``, sharded past
    ``max_shard_bytes`` (an int or e.g. ``5GB``) under ``names``. ``config_extra`` is merged into config.json
    (e.g. the special token ids); ``extra_files`` (name -> text or bytes) are written beside the weights.

    The config is made before anything is written, so args the format cannot represent fail
    first. The folder appears only when complete; a non-empty one is refused unless ``overwrite``, and then
    only the files written (and an earlier write's weight files) are replaced (``atomic_directory``). A full
    disk is a ``DiskFullError`` naming the folder. A sharded model (``DTensor`` parameters) is
    gathered one parameter at a time on rank 0, every process of its mesh taking part (all must
    call this), and streamed into the files (``model_tensors``); no other process holds more than
    its shards.
    """
    check_writable_dtype(dtype)
    config = {**adapter.hf_config_from_args(model.args, dtype), **(config_extra or {})}
    params = dict(model.named_parameters())
    source = ModelTensors(adapter.hf_layout(model.args), params, dtype)
    directory = Path(directory)
    if not writes_here():
        if is_sharded(params):  # take part in every gather
            write_streamed(None, source.entries, source.fetch, names, max_shard_bytes)
        return directory
    needed = sum(entry.nbytes for entry in source.entries)
    with atomic_directory(
        directory, overwrite=overwrite, superseded=partial(previous_weight_files, names), needed_bytes=needed
    ) as staging:
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        write_streamed(staging, source.entries, source.fetch, names, max_shard_bytes, progress=progress)
        write_files(staging, extra_files or {})
    return directory
