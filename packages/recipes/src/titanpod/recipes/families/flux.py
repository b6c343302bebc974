"""FLUX.1 (diffusers' ``FluxTransformer2DModel``): the spec of its transformer, the part that trains, and its
named diffusion recipes (run by ``titanpod-diffusion``).

The autoencoder and text encoders it runs with are frozen components of a diffusion run
(``titanpod.runs.diffusion``).
"""

from __future__ import annotations

from titanpod.data.images.config import ImageDataConfig
from titanpod.device import DeviceConfig
from titanpod.graph import TrainConfig
from titanpod.kernels import KernelConfig
from titanpod.models.adapters import FLUX_TRANSFORMER_ADAPTER
from titanpod.models.flux.args import FLUX_FLAVORS
from titanpod.parallel import FLUX_PLAN, ParallelConfig
from titanpod.recipes.diffusion.recipe import DiffusionRecipe, FluxModelConfig, SampleConfig
from titanpod.recipes.families.spec import ModelClass, ModelSpec
from titanpod.recipes.recipe import OutputConfig, TargetConfig


def flux_debug() -> DiffusionRecipe:
    """Tiny FLUX (273K parameters) on the built-in shapes at 16x16 pixels: minutes on a CPU, then a sample grid
    whose images follow their prompts (checked from the pixels at the end)."""
    return DiffusionRecipe(
        name="flux_debug",
        # Word-level random text encoders: each caption word is one token, so the tiny transformer can tell colour,
        # shape, place and background apart in minutes (byte by byte it learns backgrounds and little else).
        model=FluxModelConfig(flavor="debug", autoencoder="pixels", text_encoders="random-words"),
        device=DeviceConfig(lane="auto"),
        # 8,192 drawn images: the sample prompts are mostly combinations that 512 images never show.
        data=ImageDataConfig(source="shapes", resolution=16, batch_size=32, caption_dropout=0.1, shapes_count=8192),
        # 10,000 steps: the grid passes the pixel check for 5 or 6 of its 6 prompts on seeds 0, 1 and 2 (5,000 steps:
        # 4); under 6 min 30 s on an idle 2-core machine (twice the 5,000-step run at most).
        train=TrainConfig(
            steps=10_000, lr=2e-3, warmup_steps=50, decay="cosine", min_lr_ratio=0.1, weight_decay=0.0, log_every=100
        ),
        # Guidance 3 while t > 0.5, none below: constant guidance 5 turned many circles square (it sharpens fine
        # detail too); with it, seeds 1 and 2 drew 64 and 68 of the first 90 prompts whole, with this 88 and 80.
        samples=SampleConfig(every=0, prompts=6, steps=24, cfg_scale=3.0, cfg_stop=0.5),
        output=OutputConfig(),
        target=TargetConfig(chip="cpu", chips=1),
    )


def flux1_12b() -> DiffusionRecipe:
    """FLUX.1-dev (11.9B) at 1024x1024 on 8 TPU v5p chips (a v5p-16: v5p accelerator types count TensorCores, two a
    chip): FSDP, bf16, Splash attention, whole step with recomputed blocks, the pretrained autoencoder and text
    encoders; on the xla lane its 19 double- and 38 single-stream blocks run as two loops (``train.scan_layers``),
    so the step compiles in minutes."""
    return DiffusionRecipe(
        name="flux1_12b",
        model=FluxModelConfig(
            flavor="dev", autoencoder="black-forest-labs/FLUX.1-dev/vae", text_encoders="black-forest-labs/FLUX.1-dev"
        ),
        device=DeviceConfig(lane="auto"),
        parallel=ParallelConfig(param_dtype="bfloat16", reduce_dtype="float32"),
        kernels=KernelConfig(attention="splash"),  # 512 text + 4,096 image tokens: 9 tiles of 512, no padding
        data=ImageDataConfig(source="imagefolder", path="images/", resolution=1024, batch_size=1, caption_dropout=0.1),
        train=TrainConfig(
            steps=10_000,
            lr=1e-5,
            warmup_steps=500,
            decay="constant",
            weight_decay=0.0,
            log_every=10,
            step_mode="whole_step",
            memory_policy="recompute",
            precision="bf16",
            scan_layers=True,
        ),
        samples=SampleConfig(every=1000, prompts=4, steps=28, cfg_scale=1.0),
        output=OutputConfig(),
        target=TargetConfig(chip="v5p", chips=8),
    )


SPEC = ModelSpec(
    name="flux",
    flavors=FLUX_FLAVORS,
    build=ModelClass("titanpod.models.flux.transformer", "FluxTransformer"),
    plan=FLUX_PLAN,
    hf_adapter=FLUX_TRANSFORMER_ADAPTER,
    recipes={recipe.__name__: recipe for recipe in (flux_debug, flux1_12b)},
    recipe_kind="diffusion",
)
"""The FLUX.1 transformer."""
