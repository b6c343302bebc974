"""Building a pretraining run from a recipe and running it to the end."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
from rich.console import Console

from titanpod.checkpoint import Checkpointer, complete_checkpoints, save_hf_checkpoint, save_model
from titanpod.data import TrainData, build_data, gather_data_state
from titanpod.device import Backend, get_backend, process_info
from titanpod.graph import (
    JsonlWriter,
    StepMetrics,
    TensorBoardWriter,
    TrainConfig,
    TrainSummary,
    build_step,
    train,
)
from titanpod.kernels import model_ops
from titanpod.models import Transformer, build_model, parameter_count
from titanpod.parallel import DATA_AXES, PLANS
from titanpod.parallel.torch_executor import parallelize, unshard
from titanpod.recipes.recipe import NamedRun, Recipe
from titanpod.runs.validation import validation_loss

ResumableRun = TypeVar("ResumableRun", bound=NamedRun)
"""A recipe kind with ``name``, ``output`` and ``checkpoint`` (pretraining, SFT)."""


@dataclass
class PretrainResult:
    """What a finished pretraining run leaves behind."""

    run_dir: Path
    """The run directory: recipe.json, metrics.jsonl, tensorboard/, checkpoints/, model/."""
    summary: TrainSummary
    """The training loop's summary."""
    weights_path: Path | None
    """The final weights (``<run>/model/model.safetensors``), if saved."""
    lane: str
    """The lane the run used."""
    parameters: int
    """Parameter count of the model."""
    step_description: str = "eager"
    """How steps ran: the step mode, with the memory policy and compiler where they apply."""


def prepare_run_dir(recipe: NamedRun) -> Path:
    """Create the run directory and write the recipe into it; fail early if it cannot be written.

    Under torchrun every rank must call it: rank 0 picks the name and the others receive it.
    """
    name = recipe.output.run_name or f"{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if dist.is_initialized():
        chosen = [name]
        dist.broadcast_object_list(chosen, src=0)  # a timestamped name could differ by a second
        name = chosen[0]
    run_dir = Path(recipe.output.runs_dir) / name
    if not process_info().is_main:
        return run_dir
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "recipe.json").write_text(recipe.to_json(), encoding="utf-8")
    except OSError as error:
        raise OSError(
            f"Cannot write the run directory {run_dir}: {error.strerror}. "
            "Choose another with --output.runs-dir or --output.run-name."
        ) from error
    return run_dir


def latest_resumable_run(recipe: NamedRun) -> str | None:
    """Name of the newest run directory of ``recipe`` (``<name>-<timestamp>``) holding a complete checkpoint."""
    runs = Path(recipe.output.runs_dir)
    candidates = [
        run for run in runs.glob(f"{recipe.name}-*") if run.is_dir() and complete_checkpoints(run / "checkpoints")
    ]
    return max(candidates, key=lambda run: run.name).name if candidates else None


def with_resume(recipe: ResumableRun) -> ResumableRun:
    """``--resume``: the recipe set to continue its run (``--output.run-name``, else the newest
    run of this recipe under ``--output.runs-dir`` that has a complete checkpoint).

    ``ValueError`` when there is no such run, saying how to name one or start afresh.
    """
    run_name = recipe.output.run_name or latest_resumable_run(recipe)
    if run_name is None:
        raise ValueError(
            f"--resume: no run of recipe {recipe.name} under {recipe.output.runs_dir} has a complete checkpoint; "
            "name the run with --output.run-name, or start a new one without --resume."
        )
    return dataclasses.replace(
        recipe,
        output=dataclasses.replace(recipe.output, run_name=run_name),
        checkpoint=dataclasses.replace(recipe.checkpoint, resume="auto"),
    )


def build_run_data(recipe: Recipe, vocab_size: int, rank: int, world_size: int) -> TrainData:
    """The recipe's training (and held-out) batches for data-parallel rank ``rank`` of ``world_size``."""
    return build_data(recipe.data, vocab_size, recipe.train.seed, rank, world_size)


def build_initialised_model(recipe: Recipe, backend: Backend) -> Transformer:
    """Build the recipe's model on the meta device, then materialise and initialise it on the backend's device
    (on the host for the xla lane, whose step places the parameters on the JAX devices itself)."""
    model = build_model(recipe.model.family, recipe.model.args(), model_ops(recipe.kernels))
    model.to_empty(device="cpu" if backend.lane == "xla" else backend.device(process_info().local_rank))
    model.init_weights(recipe.train.seed)
    return model


def run_pretraining(recipe: Recipe, console: Console | None = None) -> PretrainResult:
    """Train the recipe's model on its data and write metrics and weights to a new run directory.

    Under torchrun the model is sharded by its family's plan and ``recipe.parallel``; only
    rank 0 prints and writes.
    """
    info = process_info()
    backend = get_backend(recipe.device.lane)
    torch.manual_seed(recipe.train.seed)
    model = build_initialised_model(recipe, backend)
    parameters = parameter_count(model)
    sharded, xla_axes = None, None
    data_config = recipe.data
    if backend.lane == "xla":  # one controller drives every JAX device; XLA partitions by the plan
        xla_axes = recipe.parallel.mesh_axes(backend.device_count())
        data_rank, data_world = 0, 1
        # batch_size is per data rank: this one process loads the batch of every data rank of the mesh.
        data_degree = math.prod(xla_axes[axis] for axis in DATA_AXES)
        data_config = dataclasses.replace(recipe.data, batch_size=recipe.data.batch_size * data_degree)
    elif info.world_size > 1:
        sharded = parallelize(model, PLANS[recipe.model.family], recipe.parallel, backend)
        data_rank, data_world = sharded.data_rank, sharded.data_world
    else:
        data_rank, data_world = 0, 1
    data = build_data(data_config, model.args.vocab_size, recipe.train.seed, data_rank, data_world)
    batches = data.train
    if not info.is_main:
        console = None
    run_dir = prepare_run_dir(recipe)
    say = (lambda message: console.print(message, soft_wrap=True)) if console is not None else (lambda message: None)
    checkpointer = Checkpointer(run_dir, recipe.checkpoint, recipe.to_json(), say)
    checkpointer.remove_partial()
    step = build_step(model, recipe.train, backend, plan=PLANS[recipe.model.family], axes=xla_axes)
    start_step = 0
    resume_from = checkpointer.resume_folder()
    if resume_from is not None:
        point = checkpointer.load(resume_from, model, step, recipe.to_dict())
        batches.load_state_dict(point.data_state)
        start_step = point.step
        say(f"resumed from {resume_from}: {start_step} of {recipe.train.steps} steps done")
        if start_step >= recipe.train.steps:
            say("nothing left to train: raise --train.steps to continue this run")
    every = recipe.checkpoint.every
    validate_every = recipe.data.validation_every
    reduce = None if sharded is None else sharded.mean_over_data
    writers: list[JsonlWriter | TensorBoardWriter] = []

    validated_at: list[int] = []
    model_device = torch.device("cpu") if backend.lane == "xla" else backend.device(info.local_rank)

    def validate(step_number: int) -> None:
        if data.validation is None:
            return
        step.finish()  # the xla step hands its trained weights back to the (host) model first
        loss = validation_loss(model, data.validation, model_device, recipe.train, reduce)
        validated_at.append(step_number)
        say(f"step {step_number}: validation loss {loss:.4f} ({len(data.validation)} batches)")
        for writer in writers:
            writer.write_scalars(step_number, {"validation_loss": loss})

    def after_step(step_number: int) -> None:
        if validate_every and step_number % validate_every == 0:
            validate(step_number)
        if every and step_number % every == 0:
            checkpointer.save(step_number, model, step, gather_data_state(batches))
        checkpointer.poll()

    if console is not None:
        console.print(
            f"lane [bold]{backend.lane}[/] on {backend.device()}, {recipe.model.family} {recipe.model.flavor}: "
            f"{parameters:,} parameters; step {describe_step(recipe.train, backend.lane)}; run directory {run_dir}",
            soft_wrap=True,
        )
        console.print(data.describe(), soft_wrap=True)
    if info.is_main:
        writers.append(JsonlWriter(run_dir / "metrics.jsonl"))
        if recipe.output.tensorboard:
            writers.append(TensorBoardWriter(run_dir / "tensorboard"))

    def write_report(report: StepMetrics) -> None:
        for writer in writers:
            writer.write(report)

    try:
        summary = train(
            model,
            batches,
            recipe.train,
            backend,
            flops_per_token=model.flops_per_token(recipe.data.seq_len),
            data_parallel=data_world,
            devices=backend.device_count() if backend.lane == "xla" else info.world_size,
            reduce_loss=None if sharded is None else sharded.mean_over_data,
            on_report=write_report,
            console=console,
            step=step,
            start_step=start_step,
            after_step=after_step,
        )
        finished = summary.steps_done > start_step and not summary.interrupted and not summary.stopped_because
        if finished and summary.steps_done not in validated_at:
            validate(summary.steps_done)
        if recipe.checkpoint.at_end and summary.steps_done > start_step:
            checkpointer.save(summary.steps_done, model, step, gather_data_state(batches))
    finally:
        checkpointer.wait()  # a background save in flight is completed, whatever happened
        for writer in writers:
            writer.close()
    if sharded is not None and recipe.output.save_weights:
        unshard(model)  # every rank takes part; rank 0 writes
    weights_path = None
    if recipe.output.save_weights and summary.steps_done > 0 and info.is_main:
        weights_path = save_model(
            model,
            recipe.model.family,
            run_dir / "model",
            {"step": summary.steps_done},
            extra_files={"recipe.json": recipe.to_json()},
        )
        if recipe.checkpoint.export_hf:
            hf_path = save_hf_checkpoint(model, recipe.model.family, run_dir / "hf")
            say(f"exported the model as a Hugging Face checkpoint: {hf_path}")
    if dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another still has collectives in flight
        dist.destroy_process_group()
    return PretrainResult(
        run_dir, summary, weights_path, backend.lane, parameters, describe_step(recipe.train, backend.lane)
    )


def describe_step(train_config: TrainConfig, lane: str = "cpu") -> str:
    """The step mode in words, e.g. ``whole_step (memory policy recompute, compiler auto)``."""
    if lane == "xla":
        return f"whole_step (jax.jit, memory policy {train_config.memory_policy})"
    if train_config.step_mode == "eager":
        return "eager"
    if train_config.step_mode == "per_block":
        return f"per_block (compiler {train_config.compiler})"
    return f"whole_step (memory policy {train_config.memory_policy}, compiler {train_config.compiler})"
