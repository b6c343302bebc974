"""Building a FLUX training run from a diffusion recipe and running it: metrics, sample grids, weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from titanpod.checkpoint import Checkpointer
from titanpod.checkpoint.flux_files import save_flux_transformer
from titanpod.data.images import build_image_data, fixed_prompts, save_image_grid
from titanpod.device import get_backend
from titanpod.graph import JsonlWriter, StepMetrics, TensorBoardWriter, TrainSummary, build_step, train
from titanpod.models import parameter_count
from titanpod.models.flux.flow_matching import FlowMatchingModel
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.runs.diffusion.batches import EncodingCache, FlowMatchingBatches
from titanpod.runs.diffusion.components import DiffusionModels, build_diffusion_models
from titanpod.runs.diffusion.sampling import generate
from titanpod.runs.pretrain import prepare_run_dir

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


def write_samples(models: DiffusionModels, recipe: DiffusionRecipe, path: Path) -> Path:
    """Draw the fixed prompts and write them as one PNG grid with their captions."""
    prompts = fixed_prompts(recipe.samples.prompts)
    images = generate(models, prompts, recipe.data.resolution, recipe.samples, recipe.model.guidance)
    return save_image_grid(images, path, captions=prompts)


def run_diffusion(recipe: DiffusionRecipe, console: Console | None = None) -> DiffusionResult:
    """Train the recipe's FLUX transformer by flow matching; write metrics, sample grids and weights."""
    if recipe.train.step_mode == "whole_step":
        raise ValueError("Diffusion runs take train.step_mode eager or per_block; whole_step is not available yet.")
    backend = get_backend(recipe.device.lane)
    if backend.lane == "xla":
        raise ValueError("Diffusion runs on the cpu, cuda or tpu lanes; the xla lane is not available for them yet.")
    device = backend.device()
    torch.manual_seed(recipe.train.seed)
    models = build_diffusion_models(recipe, device)
    data = build_image_data(recipe.data, recipe.train.seed, 0, 1)
    run_dir = prepare_run_dir(recipe)
    say = (lambda message: console.print(message, soft_wrap=True)) if console is not None else (lambda message: None)
    cache = EncodingCache(Path(recipe.model.encodings_cache) if recipe.model.encodings_cache else None)
    guidance = recipe.model.guidance if models.transformer.args.guidance_embed else None
    batches = FlowMatchingBatches(data, models, cache, guidance, recipe.train.seed, 0, device)
    objective = FlowMatchingModel(models.transformer)
    side = recipe.data.resolution // models.codec.downsample
    image_tokens = (side // 2) ** 2
    text_tokens = models.text_encoders.t5_max_length
    flops_per_token = models.transformer.flops_per_sample(image_tokens, text_tokens) / image_tokens
    parameters = parameter_count(models.transformer)
    say(
        f"lane [bold]{backend.lane}[/] on {device}, FLUX {recipe.model.flavor}: {parameters:,} parameters; "
        f"{image_tokens} image tokens + {text_tokens} text tokens per sample; codec {recipe.model.autoencoder}; "
        f"run directory {run_dir}"
    )
    say(data.describe())
    samples_dir = run_dir / "samples"
    samples: list[Path] = []
    writers: list[JsonlWriter | TensorBoardWriter] = [JsonlWriter(run_dir / "metrics.jsonl")]
    if recipe.output.tensorboard:
        writers.append(TensorBoardWriter(run_dir / "tensorboard"))

    def write_report(report: StepMetrics) -> None:
        for writer in writers:
            writer.write(report)

    step = build_step(objective, recipe.train, backend)
    checkpointer = Checkpointer(run_dir, recipe.checkpoint, recipe.to_json(), say)
    checkpointer.remove_partial()
    start_step = 0
    resume_from = checkpointer.resume_folder()
    if resume_from is not None:
        point = checkpointer.load(resume_from, objective, step, recipe.to_dict())
        batches.load_state_dict(point.data_state)
        start_step = point.step
        say(f"resumed from {resume_from}: {start_step} of {recipe.train.steps} steps done")

    def after_step(step_number: int) -> None:
        if recipe.samples.every and step_number % recipe.samples.every == 0:
            samples.append(write_samples(models, recipe, samples_dir / f"step-{step_number:06d}.png"))
            say(f"samples: {samples[-1]}")
        if recipe.checkpoint.every and step_number % recipe.checkpoint.every == 0:
            checkpointer.save(step_number, objective, step, batches.state_dict())
        checkpointer.poll()

    try:
        summary = train(
            objective,
            batches,
            recipe.train,
            backend,
            flops_per_token=flops_per_token,
            on_report=write_report,
            console=console,
            step=step,
            after_step=after_step,
            start_step=start_step,
            count_tokens=lambda batch: batch["latents"].shape[0] * batch["latents"].shape[1],
        )
        if recipe.checkpoint.at_end and summary.steps_done > start_step:
            checkpointer.save(summary.steps_done, objective, step, batches.state_dict())
    finally:
        checkpointer.wait()
        for writer in writers:
            writer.close()
    if summary.steps_done > start_step and samples[-1:] != [samples_dir / f"step-{summary.steps_done:06d}.png"]:
        samples.append(write_samples(models, recipe, samples_dir / f"step-{summary.steps_done:06d}.png"))
        say(f"samples: {samples[-1]}")
    transformer_path = None
    if recipe.output.save_weights and summary.steps_done > start_step:
        transformer_path = save_flux_transformer(models.transformer, run_dir / TRANSFORMER_FOLDER)
    return DiffusionResult(
        run_dir, summary, samples, transformer_path, parameters, summary.tokens_per_second / image_tokens
    )
