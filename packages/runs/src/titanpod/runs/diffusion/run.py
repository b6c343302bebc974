"""Building a FLUX training run from a diffusion recipe and running it: metrics, sample grids, weights."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from titanpod.checkpoint.flux_files import save_flux_transformer
from titanpod.data.images import build_image_data, fixed_prompts, save_image_grid
from titanpod.data.images.prompt_check import PromptCheck
from titanpod.device import get_backend, process_info
from titanpod.graph import TrainSummary, build_step
from titanpod.graph.capture import autocast_context
from titanpod.models import parameter_count
from titanpod.models.flux.flow_matching import FlowMatchingModel
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.runs.device_fit import check_diffusion_fits_device
from titanpod.runs.diffusion.batches import EncodingCache, FlowMatchingBatches
from titanpod.runs.diffusion.components import DiffusionModels, build_diffusion_models
from titanpod.runs.diffusion.prompt_report import PROMPT_CHECK_FILE, check_prompts, report_prompt_checks
from titanpod.runs.diffusion.sampling import generate
from titanpod.runs.placement import Placement, start_placement
from titanpod.runs.session import RunSession

OBJECTIVE_TRANSFORMER = "transformer"
"""The attribute of ``FlowMatchingModel`` holding the transformer: the prefix of the trained parameters' names."""

TRANSFORMER_FOLDER = "transformer"
"""Where a run writes its trained transformer (diffusers FluxTransformer2DModel layout)."""


@dataclass
class DiffusionResult:
    """What a finished diffusion run leaves behind."""

    run_dir: Path
    """The run directory: recipe.json, metrics.jsonl, samples/, transformer/."""
    summary: TrainSummary
    """The training loop's summary."""
    samples: list[Path]
    """Sample grids written, in order."""
    transformer_path: Path | None
    """The trained transformer's folder, if saved."""
    parameters: int
    """Transformer parameters."""
    samples_per_second: float
    """Training images per second after the first step."""
    is_main: bool = True
    """Whether this process is rank 0 (the one that prints and writes)."""
    processes: int = 1
    """Processes in the job (more than one under torchrun)."""
    prompt_checks: list[PromptCheck] = dataclasses.field(default_factory=list)
    """The pixel check of each image of the last sample grid against its prompt (empty unless the run trained
    on the built-in shapes and drew a grid)."""


def write_samples(
    models: DiffusionModels, recipe: DiffusionRecipe, path: Path, write: bool = True
) -> tuple[Path, torch.Tensor]:
    """Draw the fixed prompts and, with ``write``, save them as one PNG grid with their captions at ``path``;
    the path and the images [B, 3, H, W] in [-1, 1].

    A sharded transformer's forward is a collective: every rank draws, one (``write``) saves. The images are drawn
    in the training step's precision (``train.precision``): FSDP's ``param_dtype`` bfloat16 gathers bf16 weights,
    which take bf16 inputs.
    """
    prompts = fixed_prompts(recipe.samples.prompts)
    device_type = next(models.transformer.parameters()).device.type
    with autocast_context(recipe.train, device_type):
        images = generate(models, prompts, recipe.data.resolution, recipe.samples, recipe.model.guidance)
    return (save_image_grid(images, path, captions=prompts) if write else path), images


def check_block_recompute(recipe: DiffusionRecipe, single_controller: bool) -> None:
    """``ValueError`` when ``model.recompute_blocks`` meets a step that recomputes blocks by its memory policy
    instead (the whole step, and every step of the xla lane), naming the setting to use."""
    if recipe.model.recompute_blocks and (recipe.train.step_mode == "whole_step" or single_controller):
        raise ValueError(
            "model.recompute_blocks wraps each FLUX block in torch.utils.checkpoint, for the eager and per_block "
            "steps; the whole step (and every step of the xla lane) recomputes blocks by its memory policy: drop "
            "--model.recompute-blocks and set --train.step-mode whole_step --train.memory-policy recompute."
        )


def objective_step_options(placement: Placement, recipe: DiffusionRecipe) -> dict[str, Any]:
    """``build_step``'s keyword arguments for the flow-matching objective, which holds the placed transformer as
    ``transformer``: the placement's, with parameters to create (the xla lane) read by the transformer's names."""
    options = placement.step_options(recipe.parallel)
    values = options["initial_values"]
    if values is not None:
        prefix = f"{OBJECTIVE_TRANSFORMER}."

        def objective_values(name: str, region: tuple[slice, ...]) -> torch.Tensor:
            return values(name.removeprefix(prefix), region)

        options["initial_values"] = objective_values
    return options


def run_diffusion(recipe: DiffusionRecipe, console: Console | None = None) -> DiffusionResult:
    """Train the recipe's FLUX transformer by flow matching; print the recipe, write metrics, sample grids and weights.

    Under torchrun the transformer is sharded by the FLUX plan and ``recipe.parallel`` (FSDP, HSDP with
    ``parallel.dp_replicate``, tensor parallelism with ``parallel.tp``: tp ranks read the same images); the
    frozen text encoders and autoencoder are whole on every rank. Each data
    rank trains on its share of every global batch (``data.batch_size`` images per rank), the noise and
    timesteps of a sample follow from its place in the global batch (not from the rank split) and the
    reported loss is the mean over data ranks. Sample grids are drawn by every rank (the sharded forward is
    a collective) and written by rank 0; the final transformer is gathered whole and written by rank 0.

    On the xla lane one process drives every device: the step (the whole step as one ``jax.jit`` program)
    creates the transformer's parameters sharded on the devices from the seed, the process loads every data
    rank's share of each global batch, and the step hands its weights back to the host transformer before
    each sample grid. ``train.step_mode`` ``whole_step`` captures the step with its memory policy
    (``train.memory_policy``) applied to the double- and single-stream blocks.
    """
    backend = get_backend(recipe.device.lane)
    layout = start_placement("diffusion", recipe.parallel, recipe.train, backend)
    check_block_recompute(recipe, backend.single_controller)
    check_diffusion_fits_device(recipe, backend)  # on an accelerator: its plan against the device, before building
    info = process_info()
    device = backend.parameter_device(info.local_rank)  # the host on the xla lane: its step places the transformer
    torch.manual_seed(recipe.train.seed)
    sharded = info.world_size > 1 or backend.single_controller
    models = build_diffusion_models(recipe, device, sharded=sharded)  # a seeded transformer: on meta
    side = recipe.data.resolution // models.codec.downsample
    image_tokens = (side // 2) ** 2
    text_tokens = models.text_encoders.t5_max_length
    flops_per_token = models.transformer.flops_per_sample(image_tokens, text_tokens) / image_tokens
    parameters = parameter_count(models.transformer)
    # Only the trained transformer is placed: the frozen encoders stay whole on every rank.
    placement = layout.place(models.transformer, "flux", models.initial_values)
    data_config = dataclasses.replace(recipe.data, batch_size=placement.batch_size(recipe.data.batch_size))
    data = build_image_data(data_config, recipe.train.seed, placement.data_rank, placement.data_world)
    cache = EncodingCache(Path(recipe.model.encodings_cache) if recipe.model.encodings_cache else None)
    guidance = recipe.model.guidance if models.transformer.args.guidance_embed else None
    batches = FlowMatchingBatches(data, models, cache, guidance, recipe.train.seed, device)
    objective = FlowMatchingModel(models.transformer)
    with RunSession(recipe, backend, console) as session:
        session.say(
            f"lane [bold]{backend.lane}[/] on {backend.device(info.local_rank)}, FLUX {recipe.model.flavor}: "
            f"{parameters:,} parameters; "
            f"layout {placement.describe(recipe.parallel, info.world_size)}; "
            f"{image_tokens} image tokens + {text_tokens} text tokens per sample; codec {recipe.model.autoencoder}; "
            f"run directory {session.run_dir}"
        )
        session.say(data.describe())
        samples_dir = session.run_dir / "samples"
        samples: list[Path] = []
        checks: list[PromptCheck] = []

        def sample(step_number: int) -> None:
            step.finish()  # a single-controller step hands its trained weights back to the (host) transformer first
            path = samples_dir / f"step-{step_number:06d}.png"
            written, images = write_samples(models, recipe, path, write=session.is_main)
            samples.append(written)
            session.say(f"samples: {samples[-1]}")
            if recipe.data.source == "shapes":
                checks[:] = check_prompts(fixed_prompts(recipe.samples.prompts), images)
            if session.is_main:
                session.write_image(step_number, "samples", samples[-1])  # TensorBoard's and W&B's images

        def after_step(step_number: int) -> None:
            if recipe.samples.every and step_number % recipe.samples.every == 0:
                sample(step_number)

        step = build_step(objective, recipe.train, backend, **objective_step_options(placement, recipe))
        start_step = session.resume(objective, step, batches, data_state=batches.gather_state)
        summary = session.train(
            batches,
            flops_per_token=flops_per_token,
            data_parallel=placement.data_world,
            reduce_loss=placement.reduce_loss,
            after_step=after_step,
            count_tokens=lambda batch: batch["latents"].shape[0] * batch["latents"].shape[1],
        )
        trained = summary.steps_done > start_step and not summary.stopped_at_once  # else weights may be mid-step
        if trained and samples[-1:] != [samples_dir / f"step-{summary.steps_done:06d}.png"]:
            sample(summary.steps_done)
        if checks:
            report = report_prompt_checks(checks, samples[-1], session.run_dir / PROMPT_CHECK_FILE, session.is_main)
            for line in report:
                session.say(line)
        transformer_path = None
        if summary.steps_done > start_step:
            transformer_path = session.save_final_weights(
                summary, lambda: save_flux_transformer(models.transformer, session.run_dir / TRANSFORMER_FOLDER)
            )
    return DiffusionResult(
        session.run_dir,
        summary,
        samples,
        transformer_path,
        parameters,
        summary.tokens_per_second / image_tokens,
        info.is_main,
        info.world_size,
        checks,
    )
