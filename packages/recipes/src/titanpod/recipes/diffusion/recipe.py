"""The typed diffusion recipe: one object that decides everything a FLUX training run does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from titanpod.data.images.config import ImageDataConfig
from titanpod.kernels import KernelConfig
from titanpod.kernels.config import flux_kernel_problems
from titanpod.models.choice import choose
from titanpod.models.flux import FLUX_FLAVORS, FluxArgs
from titanpod.parallel import ParallelConfig
from titanpod.recipes.diffusion.flux_shape import FluxShape
from titanpod.recipes.recipe import RunRecipe, TargetConfig

FluxFlavor = Literal["debug", "schnell", "dev"]
"""What ``FluxModelConfig.flavor`` accepts (``titanpod.models.flux.FLUX_FLAVORS``)."""
RANDOM_TEXT_ENCODERS = {"random": 128, "random-words": 24}
"""The tiny random text encoders ``FluxModelConfig.text_encoders`` names, with the T5 tokens each reads per prompt:
``random`` reads bytes (128 hold the longest caption of the built-in shapes, 98 bytes, and its end token),
``random-words`` whole words of those captions (24 hold the longest, 19 words, and its end token)."""


@dataclass(frozen=True)
class FluxModelConfig:
    """Which transformer, autoencoder and text encoders to use."""

    flavor: FluxFlavor = "debug"
    """Transformer shape: ``debug``, ``schnell`` or ``dev`` (titanpod.models.flux.FLUX_FLAVORS)."""
    shape: FluxShape = field(default_factory=FluxShape)
    """Sizes that replace the flavor's (all ``None``: the flavor as published); rehearsals shrink the transformer
    with it."""
    autoencoder: str = "pixels"
    """``pixels`` (no autoencoder: the transformer models 2x2 pixel patches, so a CPU run's samples are
    readable without pretrained weights), an autoencoder flavor (``debug``, ``flux``; randomly initialised),
    or a diffusers AutoencoderKL folder (e.g. the ``vae`` folder of FLUX.1-dev)."""
    text_encoders: str = "random"
    """``random`` (tiny T5 and CLIP, randomly initialised, offline, reading any text byte by byte),
    ``random-words`` (the same, reading the words of the built-in shapes captions, one token each, so a
    small transformer tells the prompts apart quickly), or a diffusers FLUX folder or Hub id whose
    text_encoder / text_encoder_2 subfolders hold CLIP and T5."""
    transformer_weights: str | None = None
    """A diffusers FluxTransformer2DModel folder to start from; ``None`` initialises from the seed."""
    guidance: float = 1.0
    """The guidance value a guidance-distilled transformer (dev) is given while training."""
    recompute_blocks: bool = False
    """Keep only each transformer block's inputs in the forward pass and recompute the rest in the backward
    (activation checkpointing), trading a second forward for activation memory: for the eager and per_block
    steps. The whole step, and every step of the xla lane, recompute by ``train.memory_policy`` instead."""
    encodings_cache: str | None = None
    """A folder where the frozen encoders' outputs (latents per image, text states per caption) are kept as
    safetensors, so later epochs and runs do not encode again; ``None`` keeps them in memory for this run."""

    def args(self) -> FluxArgs:
        """The transformer's shape: the flavor's with ``shape`` applied (``in_channels`` is the codec's to set)."""
        return self.shape.apply(choose("FLUX flavor", self.flavor, FLUX_FLAVORS))


@dataclass(frozen=True)
class SampleConfig:
    """Sample images written during and after training."""

    every: int = 0
    """Write a sample grid every this many steps (0: only after the last step)."""
    prompts: int = 4
    """How many of the fixed prompts to draw (one image each)."""
    steps: int = 24
    """Euler steps from noise to image."""
    cfg_scale: float = 3.0
    """Classifier-free guidance: velocity = uncond + scale x (cond - uncond); 1 turns it off."""
    cfg_stop: float = 0.0
    """The timestep (1 noise, 0 image) where guidance stops: the Euler steps that start at t <= cfg_stop take the
    conditional velocity alone, as with scale 1 (0: guidance on every step). Guidance then shapes the image's
    layout at high noise and leaves its fine detail to the model; it also skips those steps' unconditional pass."""
    seed: int = 0
    """Seed of the starting noise (the same every time, so grids are comparable across steps)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.cfg_stop < 1.0:
            raise ValueError(
                f"samples.cfg_stop is a timestep from 0 (guidance on every step) up to, not including, 1 (pure "
                f"noise), e.g. 0.5; got {self.cfg_stop}."
            )


@dataclass(frozen=True)
class DiffusionRecipe(RunRecipe):
    """A complete, reproducible description of a FLUX training run."""

    model: FluxModelConfig = field(default_factory=FluxModelConfig)
    """The models."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """How it splits over processes (the dry run plans with it)."""
    kernels: KernelConfig = field(default_factory=KernelConfig)
    """What fills the transformer's attention slot: ``attention`` ``sdpa`` (the reference) or ``splash`` (Splash
    attention, unmasked, with ``splash``'s tiles); FLUX has no vocabulary head, experts or local window, so the
    other fields keep their defaults (anything else is refused, naming the field)."""
    data: ImageDataConfig = field(default_factory=ImageDataConfig)
    """Images and captions."""
    samples: SampleConfig = field(default_factory=SampleConfig)
    """What sample images it writes."""
    target: TargetConfig = field(default_factory=TargetConfig)
    """The slice the recipe is sized for; read by ``--dry-run`` only."""

    def __post_init__(self) -> None:
        super().__post_init__()
        problems = flux_kernel_problems(self.kernels)
        if problems:
            raise ValueError("The kernels asked for do not fit FLUX:\n  " + "\n  ".join(problems) + ".")
