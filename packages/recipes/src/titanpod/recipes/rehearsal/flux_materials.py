"""Local stand-ins for what a FLUX recipe reads from outside: an image folder, the autoencoder and text encoders.

The image folder is what ``data.source imagefolder`` reads (PNG files and a ``metadata.jsonl`` of captions), drawn
from the built-in shapes. The pipeline folder has the layout of ``black-forest-labs/FLUX.1-dev`` (``vae/``,
``text_encoder/`` and ``tokenizer/`` for CLIP, ``text_encoder_2/`` and ``tokenizer_2/`` for T5), holding tiny
randomly initialised models of the same architecture, so a rehearsal reads them through the same loaders a pod
run reads the published weights through.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from titanpod.checkpoint.flux_autoencoder_files import PIPELINE_SUBFOLDER, save_flux_autoencoder
from titanpod.data.images.shapes import draw_shapes
from titanpod.models.flux.autoencoder import FLUX_AUTOENCODER_FLAVORS, build_flux_autoencoder
from titanpod.models.flux.autoencoder_args import FluxAutoencoderArgs
from titanpod.models.flux.text_encoders import FluxTextEncoders, TinyTextEncoderConfig

IMAGES = 24
"""Images in the rehearsal's folder: three global batches of the xla lane's 8 data ranks, so a run crosses epochs."""
IMAGE_SCALE = 2
"""The folder's images are this many times the training side, so the pipeline's resize runs as on real photos."""
AUTOENCODER_WIDTHS = (16, 16, 32, 32)
"""Channels of each level of the small autoencoder: as many levels as FLUX's (8x downsampling)."""
AUTOENCODER_GROUPS = 4
"""GroupNorm groups of the small autoencoder (FLUX's has 4 channels a group at its first level, as here)."""


def write_image_folder(folder: Path, resolution: int, seed: int, count: int = IMAGES) -> Path:
    """Write ``count`` shape images of ``IMAGE_SCALE x resolution`` pixels with a ``metadata.jsonl`` of captions."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for index in range(count):
        image, caption = draw_shapes(seed, index, IMAGE_SCALE * resolution)
        name = f"{index:04d}.png"
        image.save(folder / name)
        rows.append(json.dumps({"file_name": name, "text": caption}))
    (folder / "metadata.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def small_autoencoder_args() -> FluxAutoencoderArgs:
    """FLUX's autoencoder made narrow: the same levels, residual blocks, latent channels and latent scaling."""
    full = FLUX_AUTOENCODER_FLAVORS["flux"]
    return dataclasses.replace(
        full, block_out_channels=AUTOENCODER_WIDTHS, norm_num_groups=AUTOENCODER_GROUPS, sample_size=64
    )


def write_pipeline_folder(folder: Path, context_dim: int, pooled_dim: int, seed: int) -> Path:
    """Write a tiny random FLUX pipeline folder (autoencoder, CLIP and T5 with their tokenizers); returns ``folder``.

    The text encoders give ``context_dim``-wide T5 states and a ``pooled_dim``-wide CLIP vector, the widths the
    small transformer takes.
    """
    autoencoder = build_flux_autoencoder(small_autoencoder_args(), device="cpu")
    autoencoder.init_weights(seed)
    save_flux_autoencoder(autoencoder, folder / PIPELINE_SUBFOLDER)
    encoders = FluxTextEncoders.random(TinyTextEncoderConfig(context_dim=context_dim, pooled_dim=pooled_dim), seed)
    encoders.save_pretrained(folder)
    return folder
