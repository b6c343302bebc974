"""Building a diffusion run's models: the FLUX transformer, the image codec and the frozen text encoders.

Legend: B batch, C channels, H height, W width.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from titanpod.checkpoint.flux_autoencoder_files import load_flux_autoencoder
from titanpod.checkpoint.flux_files import load_flux_transformer
from titanpod.data.images.shapes import caption_words
from titanpod.kernels import flux_ops
from titanpod.models import RegionValues, region_initializer
from titanpod.models.choice import choose
from titanpod.models.flux import FluxArgs, FluxTransformer, build_flux_transformer
from titanpod.models.flux.autoencoder import FLUX_AUTOENCODER_FLAVORS, FluxAutoencoder, build_flux_autoencoder
from titanpod.models.flux.text_encoders import FluxTextEncoders, TinyTextEncoderConfig
from titanpod.recipes.diffusion.recipe import RANDOM_TEXT_ENCODERS, DiffusionRecipe


class ImageCodec(Protocol):
    """Images in [-1, 1] <-> the latents the transformer models."""

    channels: int
    """Latent channels."""
    downsample: int
    """Image pixels per latent pixel, per side."""

    def encode(self, images_BCHW: torch.Tensor) -> torch.Tensor:
        """Latents of ``images`` in the transformer's space."""
        ...

    def decode(self, latents_BCHW: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] from latents in the transformer's space."""
        ...


class PixelCodec:
    """No autoencoder: the latents are the pixels (3 channels, full resolution)."""

    channels = 3
    downsample = 1

    def encode(self, images_BCHW: torch.Tensor) -> torch.Tensor:
        """The images themselves."""
        return images_BCHW

    def decode(self, latents_BCHW: torch.Tensor) -> torch.Tensor:
        """The latents, clipped to [-1, 1]."""
        return latents_BCHW.clamp(-1.0, 1.0)


class AutoencoderCodec:
    """The FLUX autoencoder: the mean of the posterior, shifted and scaled into the transformer's space."""

    def __init__(self, autoencoder: FluxAutoencoder) -> None:
        self.autoencoder = autoencoder.requires_grad_(False).eval()
        self.channels = autoencoder.args.latent_channels
        self.downsample = autoencoder.args.downsample_factor

    @torch.no_grad()
    def encode(self, images_BCHW: torch.Tensor) -> torch.Tensor:
        """``(mean - shift) x scale`` of the encoder's posterior."""
        return self.autoencoder.to_model_space(self.autoencoder.encode(images_BCHW).mode())

    @torch.no_grad()
    def decode(self, latents_BCHW: torch.Tensor) -> torch.Tensor:
        """The decoder's image, clipped to [-1, 1]."""
        return self.autoencoder.decode(self.autoencoder.from_model_space(latents_BCHW)).clamp(-1.0, 1.0)


@dataclass
class DiffusionModels:
    """Everything a diffusion run computes with."""

    transformer: FluxTransformer
    """The model being trained."""
    codec: ImageCodec
    """Images <-> latents (frozen)."""
    text_encoders: FluxTextEncoders
    """Captions -> (T5 states, pooled CLIP vector) (frozen)."""
    initial_values: RegionValues | None = None
    """What to create the transformer's parameters from while it is still on the meta device (hand it to
    the placement as ``initial_values``); ``None`` when the transformer is already materialised."""


def build_codec(name: str, seed: int) -> ImageCodec:
    """``pixels``, an autoencoder flavor (randomly initialised from ``seed``), or a diffusers AutoencoderKL folder."""
    if name == "pixels":
        return PixelCodec()
    if Path(name).is_dir():
        return AutoencoderCodec(load_flux_autoencoder(Path(name)))
    choose("autoencoder (or a diffusers AutoencoderKL folder)", name, {"pixels": None, **FLUX_AUTOENCODER_FLAVORS})
    autoencoder = build_flux_autoencoder(name, device="cpu")
    autoencoder.init_weights(seed)
    return AutoencoderCodec(autoencoder)


def build_text_encoders(name: str, context_dim: int, pooled_dim: int, seed: int) -> FluxTextEncoders:
    """Tiny random encoders sized for the transformer (``random``: reading bytes; ``random-words``: the words of
    the built-in shapes captions), or the pretrained ones of a FLUX folder / Hub id."""
    if name in RANDOM_TEXT_ENCODERS:
        config = TinyTextEncoderConfig(
            context_dim=context_dim,
            pooled_dim=pooled_dim,
            t5_max_length=RANDOM_TEXT_ENCODERS[name],
            words=caption_words() if name == "random-words" else (),
        )
        return FluxTextEncoders.random(config, seed)
    return FluxTextEncoders.from_pretrained(name)


def transformer_args(recipe: DiffusionRecipe, latent_channels: int) -> FluxArgs:
    """The shape of the recipe's transformer (its flavor with ``model.shape``) for a codec of ``latent_channels``
    (2 x 2 of them a token)."""
    return dataclasses.replace(recipe.model.args(), in_channels=latent_channels * 4, out_channels=None)


def meta_transformer(recipe: DiffusionRecipe, args: FluxArgs) -> FluxTransformer:
    """The recipe's transformer of shape ``args`` on the meta device, with the ops its step runs: what a run
    trains and what ``--compile-for`` compiles (``titanpod.runs.diffusion.slice_compile``): its attention slot
    filled by ``recipe.kernels``."""
    return build_flux_transformer(args, flux_ops(recipe.kernels))


def build_diffusion_models(recipe: DiffusionRecipe, device: torch.device, sharded: bool = False) -> DiffusionModels:
    """The recipe's transformer (initialised or loaded, its attention slot filled by ``recipe.kernels``), codec
    and text encoders, on ``device``.

    With ``sharded`` and a seed (no ``model.transformer_weights``) the transformer stays on the meta device and
    the region init of ``train.seed`` comes with it (``DiffusionModels.initial_values``): the placement then
    creates only each rank's shards, equal bit for bit to the whole ``init_weights(seed)``. The frozen codec
    and text encoders are always whole on ``device``.
    """
    model = recipe.model
    seed = recipe.train.seed
    codec = build_codec(model.autoencoder, seed)
    args = transformer_args(recipe, codec.channels)
    text_encoders = build_text_encoders(model.text_encoders, args.context_dim, args.pooled_dim, seed)
    if text_encoders.context_dim != args.context_dim or text_encoders.pooled_dim != args.pooled_dim:
        raise ValueError(
            f"The text encoders give {text_encoders.context_dim}-wide T5 states and a {text_encoders.pooled_dim}-wide "
            f"pooled vector, but FLUX {model.flavor} takes {args.context_dim} and {args.pooled_dim}; "
            "use text encoders made for this flavor."
        )
    if model.transformer_weights is not None:
        transformer = load_flux_transformer(Path(model.transformer_weights), ops=flux_ops(recipe.kernels))
        if transformer.args.in_channels != args.in_channels:
            raise ValueError(
                f"The transformer at {model.transformer_weights} takes {transformer.args.in_channels} channels per "
                f"token but model.autoencoder {model.autoencoder!r} gives {args.in_channels}; pick the matching one."
            )
    else:
        transformer = meta_transformer(recipe, args)
    initial_values = None
    if sharded and model.transformer_weights is None:
        initial_values = region_initializer(transformer, seed)
    elif model.transformer_weights is None:
        transformer.to_empty(device="cpu")
        transformer.init_weights(seed)
    if model.recompute_blocks:
        recompute_each_block(transformer)
    text_encoders.to(device)
    if isinstance(codec, AutoencoderCodec):
        codec.autoencoder.to(device)
    if initial_values is None:
        transformer = transformer.to(device)
    return DiffusionModels(transformer, codec, text_encoders, initial_values)


def recompute_each_block(transformer: FluxTransformer) -> None:
    """Activation checkpointing: each block keeps only its inputs and runs again in the backward pass."""
    from torch.utils.checkpoint import checkpoint

    for block in [*transformer.double_blocks, *transformer.single_blocks]:
        forward = block.forward

        def recomputed(*inputs: torch.Tensor, _forward=forward) -> object:
            return checkpoint(_forward, *inputs, use_reentrant=False)

        block.forward = recomputed  # type: ignore[method-assign]
