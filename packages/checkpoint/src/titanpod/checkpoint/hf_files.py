"""Hugging Face (transformers) checkpoints of the decoder LLMs on disk: config.json plus sharded
safetensors, read and written one shard at a time, so a large model never sits in memory twice."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from titanpod.checkpoint.companion_files import Files
from titanpod.checkpoint.hf_folder import (
    CONFIG_FILE,
    config_errors_named,
    load_adapted,
    read_hf_config,
    save_adapted,
)
from titanpod.checkpoint.safetensors_io import (
    TRANSFORMERS_FILES,
    Progress,
    SafetensorsFiles,
    dtype_from_name,
)
from titanpod.checkpoint.special_tokens import GENERATION_CONFIG_FILE, SpecialTokens
from titanpod.models import Transformer
from titanpod.models.adapters import DecoderAdapter, adapter_of_hf_config

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_MAX_SHARD_BYTES",
    "LoadedCheckpoint",
    "iter_hf_tensors",
    "load_hf_checkpoint",
    "save_hf_checkpoint",
]

DEFAULT_MAX_SHARD_BYTES = 5 * 1000**3
"""transformers' own default shard size (5GB)."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A model read from a Hugging Face checkpoint."""

    family: str
    """titanpod model family (``llama3``, ``qwen3``, ``qwen3_moe``)."""
    model: Transformer
    """The model, on the requested device, with every parameter filled from the files."""
    special_tokens: SpecialTokens = field(default_factory=SpecialTokens)
    """The bos, eos and pad ids config.json (or generation_config.json) states."""


def load_hf_checkpoint(
    directory: Path | str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    progress: Progress | None = None,
    *,
    adapters: Mapping[str, DecoderAdapter],
) -> LoadedCheckpoint:
    """Read a Hugging Face checkpoint directory into a titanpod model, shard by shard.

    ``adapters`` (family -> adapter; ``titanpod.recipes.families.decoder_adapters()`` for the families titanpod
    ships) says which families a config.json may describe. The model is built on the meta device from
    config.json, materialised once on ``device`` (in ``dtype``, default the dtype config.json records), and filled
    tensor by tensor. Every name is checked against the model before any data is read: a missing,
    unexpected or mis-shaped tensor is a ``CheckpointMismatchError`` that names it.
    """
    directory = Path(directory)
    path, config = read_hf_config(directory)
    with config_errors_named(path):
        adapter = adapter_of_hf_config(config, adapters)
        args = adapter.args_from_hf_config(config)
    files = SafetensorsFiles.find(directory, TRANSFORMERS_FILES)
    with torch.device("meta"):
        model = Transformer(args)
    if dtype is None:
        recorded = str(config.get("dtype", config.get("torch_dtype", "float32")))
        dtype = dtype_from_name(recorded) if recorded in ("float32", "bfloat16", "float16") else torch.float32
    load_adapted(model, adapter, files, "model", device, dtype, progress)
    return LoadedCheckpoint(adapter.family, model, SpecialTokens.from_folder(directory))


def save_hf_checkpoint(
    model: Transformer,
    adapter: DecoderAdapter,
    directory: Path | str,
    max_shard_size: str | int = DEFAULT_MAX_SHARD_BYTES,
    dtype: torch.dtype | None = None,
    progress: Progress | None = None,
    overwrite: bool = True,
    special_tokens: SpecialTokens | None = None,
    extra_files: Files | None = None,
    attention_window: int | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint of ``adapter``'s class: config.json and safetensors shards.

    ``special_tokens`` go into config.json and, unless ``extra_files`` brings its own, into a
    generation_config.json; ``extra_files`` (name -> text or bytes: tokenizer files, a model card) are
    written beside the weights, in the same atomic write. ``attention_window`` is the run's ``kernels.window``:
    config.json states it, or a class without a sliding window is refused before anything is written.

    Shards are ``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json``
    when more than one is needed (``max_shard_size``, e.g. ``5GB``), else one
    ``model.safetensors``. Each tensor is copied to the CPU, written and dropped before the
    next. The directory appears only when complete; a non-empty one is refused unless ``overwrite``, and
    then only the files written are replaced (``hf_folder.save_adapted``). A sharded model is gathered one parameter
    at a time and written by one process: every process of its mesh must call this (see
    ``hf_folder.save_adapted``).
    """
    window = adapter.window_config(attention_window)  # refused before any file is written
    dtype = dtype or model.tok_embeddings.weight.dtype
    special_tokens = special_tokens or SpecialTokens()
    files = dict(extra_files or {})
    if special_tokens and GENERATION_CONFIG_FILE not in files:
        files[GENERATION_CONFIG_FILE] = json.dumps(special_tokens.generation_config(), indent=2) + "\n"
    return save_adapted(
        model,
        adapter,
        directory,
        TRANSFORMERS_FILES,
        max_shard_size,
        dtype,
        progress,
        overwrite,
        config_extra={**special_tokens.as_config(), **window},
        extra_files=files,
    )


def iter_hf_tensors(directory: Path | str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a Hugging Face checkpoint directory by name, one shard open at a time."""
    return SafetensorsFiles.find(directory, TRANSFORMERS_FILES).tensors()
