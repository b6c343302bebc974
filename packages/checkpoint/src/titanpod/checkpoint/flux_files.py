"""FLUX.1 transformer checkpoints in diffusers' layout: config.json plus sharded safetensors.

A folder written by ``FluxTransformer2DModel.save_pretrained(..., safe_serialization=True)``
(the ``transformer/`` folder of a FLUX.1 pipeline) loads into a titanpod
``FluxTransformer``, and ``save_flux_transformer`` writes one that
``FluxTransformer2DModel.from_pretrained`` reads. Weights are
``diffusion_pytorch_model.safetensors``, or shards
``diffusion_pytorch_model-0000k-of-0000n.safetensors`` with
``diffusion_pytorch_model.safetensors.index.json``; a folder named the transformers way
(``model.safetensors`` and its index) is read too. Only safetensors: pickles are never read.

Key accounting is strict: every tensor name and shape is checked against the model,
reading headers only, before any data is read; a missing, unexpected or mis-shaped tensor
is a ``CheckpointMismatchError`` that names it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from titanpod.checkpoint.hf_folder import config_errors_named, load_adapted, read_hf_config, save_adapted
from titanpod.checkpoint.safetensors_io import (
    DIFFUSERS_FILES,
    TRANSFORMERS_FILES,
    Progress,
    SafetensorsFiles,
    dtype_from_name,
)
from titanpod.models.adapters.flux_transformer import FLUX_TRANSFORMER_ADAPTER
from titanpod.models.flux import FluxArgs, FluxOps, FluxTransformer, build_flux_transformer

DIFFUSERS_SINGLE_FILE = DIFFUSERS_FILES.single
"""The single weights file of a diffusers model folder."""
DIFFUSERS_INDEX_FILE = DIFFUSERS_FILES.index
"""The shard index of a sharded diffusers model folder."""
DEFAULT_MAX_SHARD_BYTES = 10 * 1000**3
"""diffusers' own default shard size (10GB)."""


def read_flux_config(directory: Path | str) -> FluxArgs:
    """The ``FluxArgs`` of a diffusers FLUX transformer folder's config.json; errors name the file and key."""
    path, config = read_hf_config(Path(directory))
    with config_errors_named(path):
        return FLUX_TRANSFORMER_ADAPTER.args_from_hf_config(config)


def find_flux_weights(directory: Path | str) -> SafetensorsFiles:
    """The safetensors of a FLUX transformer folder: diffusers' index or single file (or transformers' names)."""
    return SafetensorsFiles.find(
        directory,
        DIFFUSERS_FILES,
        TRANSFORMERS_FILES,
        hint=": not a diffusers FLUX transformer folder (in a pipeline folder, point at its transformer/ subfolder)",
    )


def load_flux_transformer(
    directory: Path | str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    ops: FluxOps | None = None,
    progress: Progress | None = None,
) -> FluxTransformer:
    """Read a diffusers ``FluxTransformer2DModel`` folder into a titanpod ``FluxTransformer``, shard by shard.

    The model is built on the meta device from config.json, materialised once on
    ``device`` in ``dtype`` (default: the files' dtype, the widest when they mix), and filled
    tensor by tensor; a single-stream block's fused ``linear1`` is assembled from diffusers'
    q, k, v and MLP tensors. Names and shapes are all checked first: a missing, unexpected or
    mis-shaped tensor is a ``CheckpointMismatchError`` that names it.
    """
    directory = Path(directory)
    args = read_flux_config(directory)
    files = find_flux_weights(directory)
    model = build_flux_transformer(args, ops, device="meta")
    dtype = dtype_from_name(dtype) if isinstance(dtype, str) else dtype
    load_adapted(model, FLUX_TRANSFORMER_ADAPTER, files, "FLUX transformer", device, dtype, progress)
    return model


def save_flux_transformer(
    model: FluxTransformer,
    directory: Path | str,
    max_shard_bytes: int | str = DEFAULT_MAX_SHARD_BYTES,
    dtype: torch.dtype | str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write ``model`` as a diffusers ``FluxTransformer2DModel`` folder: config.json and safetensors shards.

    Shards are ``diffusion_pytorch_model-0000k-of-0000n.safetensors`` with
    ``diffusion_pytorch_model.safetensors.index.json`` when more than one is needed
    (``max_shard_bytes``, an int or e.g. ``5GB``), else one
    ``diffusion_pytorch_model.safetensors``. Tensors are written in ``dtype`` (default the
    model's). Each shard is copied to the CPU, written and dropped before the next. The
    directory appears only when complete. Args diffusers cannot represent raise
    ``UnsupportedConfigError`` before anything is written.
    """
    dtype = dtype_from_name(dtype) if isinstance(dtype, str) else (dtype or model.img_in.weight.dtype)
    return save_adapted(model, FLUX_TRANSFORMER_ADAPTER, directory, DIFFUSERS_FILES, max_shard_bytes, dtype, progress)
