"""The FLUX autoencoder on disk in diffusers' folder layout: config.json plus safetensors.

A folder holds ``diffusion_pytorch_model.safetensors``, or shards
``diffusion_pytorch_model-0000k-of-0000n.safetensors`` listed in
``diffusion_pytorch_model.safetensors.index.json``, as ``AutoencoderKL.save_pretrained``
writes them. A FLUX pipeline folder (with a ``vae/`` subfolder) is read too. Only
safetensors are read or written, never pickles.
"""

from __future__ import annotations

from pathlib import Path

import torch

from titanpod.checkpoint.hf_folder import CONFIG_FILE, config_errors_named, load_adapted, read_hf_config, save_adapted
from titanpod.checkpoint.safetensors_io import DIFFUSERS_FILES, SafetensorsFiles
from titanpod.models.adapters.flux_autoencoder import FLUX_AUTOENCODER_ADAPTER
from titanpod.models.flux.autoencoder import FluxAutoencoder, build_flux_autoencoder

WEIGHTS_FILE = DIFFUSERS_FILES.single
"""The single weights file of a diffusers model folder."""
INDEX_FILE = DIFFUSERS_FILES.index
"""The shard index of a sharded diffusers model folder."""
PIPELINE_SUBFOLDER = "vae"
"""Where a FLUX pipeline folder keeps its autoencoder."""
DEFAULT_MAX_SHARD_BYTES = 10 * 1000**3
"""diffusers' default largest shard (10 GB): the FLUX autoencoder (335 MB in float32) fits in one file."""


def _model_folder(directory: Path) -> Path:
    """``directory`` itself, or its ``vae/`` subfolder when it is a pipeline folder."""
    if not (directory / CONFIG_FILE).is_file() and (directory / PIPELINE_SUBFOLDER / CONFIG_FILE).is_file():
        return directory / PIPELINE_SUBFOLDER
    return directory


def load_flux_autoencoder(
    directory: Path | str, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> FluxAutoencoder:
    """Read a diffusers ``AutoencoderKL`` folder (or a FLUX pipeline folder's ``vae/``) into a ``FluxAutoencoder``.

    The model is built on the meta device from config.json (unsupported settings are
    errors naming the key), every tensor name and shape is checked from the file headers
    before any data is read (a missing, unexpected or mis-shaped tensor is a
    ``CheckpointMismatchError`` naming it), then the model is materialised on ``device``
    in ``dtype`` (default: the files' dtype, the widest when they mix) and filled file by
    file. Returned in eval mode.
    """
    directory = _model_folder(Path(directory))
    path, config = read_hf_config(directory)
    with config_errors_named(path):
        args = FLUX_AUTOENCODER_ADAPTER.args_from_hf_config(config)
    model = build_flux_autoencoder(args)
    files = SafetensorsFiles.find(directory, DIFFUSERS_FILES)
    load_adapted(model, FLUX_AUTOENCODER_ADAPTER, files, "autoencoder", device, dtype)
    return model.eval()


def save_flux_autoencoder(
    model: FluxAutoencoder,
    directory: Path | str,
    max_shard_bytes: int | str = DEFAULT_MAX_SHARD_BYTES,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``model`` as diffusers' ``AutoencoderKL`` folder: config.json and safetensors.

    One ``diffusion_pytorch_model.safetensors`` when everything fits in ``max_shard_bytes``
    (an integer or a size such as ``500MB``), else numbered shards and their index. Tensors
    are written in ``dtype`` (default: the model's). The folder appears only when complete;
    ``AutoencoderKL.from_pretrained`` reads it.
    """
    dtype = dtype or next(model.parameters()).dtype
    return save_adapted(model, FLUX_AUTOENCODER_ADAPTER, directory, DIFFUSERS_FILES, max_shard_bytes, dtype)
