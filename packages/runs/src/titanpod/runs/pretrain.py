"""Building a pretraining run from a recipe and running it to the end."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape

from titanpod.data import TrainData, build_data, gather_data_state
from titanpod.data.fingerprint import data_fingerprint
from titanpod.data.tokenizer import BUILTIN
from titanpod.device import Backend, get_backend, process_info
from titanpod.graph import TrainConfig, TrainSummary, build_step
from titanpod.kernels import model_ops
from titanpod.kernels.lane_check import check_kernels_on_lane
from titanpod.models import RegionValues, Transformer, parameter_count, region_initializer
from titanpod.recipes.families import build_model
from titanpod.recipes.recipe import Recipe
from titanpod.runs.checkpoint_tokenizer import check_text_tokenizer
from titanpod.runs.device_fit import check_recipe_fits_device
from titanpod.runs.final_weights import check_export, write_trained_weights
from titanpod.runs.hf_export import HFExtras, training_extras
from titanpod.runs.init_from import build_pretrained_model, following, model_args, pretrained_for
from titanpod.runs.pipelined import with_pipeline_microbatches
from titanpod.runs.placement import ENTRY_MODULES, start_placement
from titanpod.runs.resume_check import check_continuation
from titanpod.runs.run_lookup import with_resume as with_resume  # re-exported: the apps import it from here
from titanpod.runs.session import RunSession
from titanpod.runs.session_dir import prepare_run_dir as prepare_run_dir  # re-exported: runners import it from here
from titanpod.runs.validation import validation_loss

ENTRY_MODULE = ENTRY_MODULES["pretrain"]
"""The module torchrun starts for a pretraining job (``titanpod-pretrain``)."""


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


def build_run_data(recipe: Recipe, vocab_size: int, rank: int, world_size: int) -> TrainData:
    """The recipe's training (and held-out) batches for data-parallel rank ``rank`` of ``world_size``."""
    return build_data(recipe.data, vocab_size, recipe.train.seed, rank, world_size)


def build_initialised_model(recipe: Recipe, backend: Backend) -> Transformer:
    """Build the recipe's model on the meta device, then materialise and initialise it on the backend's device
    (on the host for the xla lane, whose step places the parameters on the JAX devices itself)."""
    model = build_model(recipe.model.family, recipe.model.args(), model_ops(recipe.kernels))
    model.to_empty(device=backend.parameter_device(process_info().local_rank))
    model.init_weights(recipe.train.seed)
    return model


def build_seeded_model(recipe: Recipe, backend: Backend) -> tuple[Transformer, RegionValues | None]:
    """The recipe's model initialised from ``train.seed``, and what to create it from when it is still to be sharded.

    Under torchrun, and on a single-controller lane (the xla lane), the model stays on the meta device and
    the region init of the seed comes back (``titanpod.models.region_initializer``): hand it to
    the placement (``titanpod.runs.placement``) as ``initial_values``, so each rank (each device) creates only its own
    shards and no host ever holds the whole model; the values equal one process's ``init_weights`` bit for
    bit. One process: materialised and initialised whole (``build_initialised_model``); ``None`` comes back.
    """
    if process_info().world_size > 1 or backend.single_controller:
        model = build_model(recipe.model.family, recipe.model.args(), model_ops(recipe.kernels))
        return model, region_initializer(model, recipe.train.seed)
    return build_initialised_model(recipe, backend), None


def run_pretraining(recipe: Recipe, console: Console | None = None) -> PretrainResult:
    """Train the recipe's model on its data and write metrics and weights to a new run directory.

    A run that resumes is checked against its checkpoint first (``titanpod.runs.resume_check``): one that changes
    the model or the data, or asks for fewer steps than are done, is refused before anything is built or written.
    The model is placed by ``titanpod.runs.placement``: under torchrun sharded by its family's plan and
    ``recipe.parallel`` (with pp > 1, cut into pipeline stages first); on the xla lane partitioned by the
    compiler over every device. Only rank 0 prints and writes.
    """
    recipe = with_pipeline_microbatches(recipe)
    backend = get_backend(recipe.device.lane)
    check_kernels_on_lane(recipe.kernels, backend)
    layout = start_placement("pretrain", recipe.parallel, recipe.train, backend, recipe.data.seq_len)
    torch.manual_seed(recipe.train.seed)
    pretrained = pretrained_for(recipe, console)  # a folder that does not fit fails before anything is built
    recipe = following(recipe, pretrained, BUILTIN)  # its family and tokenizer, as recipe.json records them
    check_export(recipe.model.family, recipe.kernels, recipe.checkpoint.export_hf)
    data_files = data_fingerprint(recipe.data)
    continuation = check_continuation(recipe, lambda: data_files)  # refused now, before anything is built
    if console is not None and continuation is not None:
        for line in continuation.lines():
            console.print(escape(line), soft_wrap=True)
    tokenizer_note = check_text_tokenizer(recipe.data, model_args(recipe, pretrained).vocab_size, pretrained)
    check_recipe_fits_device(recipe, backend, model_args(recipe, pretrained))  # its plan against the device
    if pretrained is None:
        model, initial_values = build_seeded_model(recipe, backend)
    else:  # under torchrun: still on the meta device, each rank's shards read from the folder by the placement
        model, initial_values = build_pretrained_model(recipe, backend, pretrained, console)
    parameters = parameter_count(model)
    placement = layout.place(model, recipe.model.family, initial_values)
    data_config = dataclasses.replace(recipe.data, batch_size=placement.batch_size(recipe.data.batch_size))
    data = build_data(data_config, model.args.vocab_size, recipe.train.seed, placement.data_rank, placement.data_world)
    batches = data.train
    info = process_info()
    model_device = backend.parameter_device(info.local_rank)
    with RunSession(recipe, backend, console, data_files) as session:
        step = build_step(placement.model, recipe.train, backend, **placement.step_options(recipe.parallel))
        start_step = session.resume(placement.model, step, batches, data_state=lambda: gather_data_state(batches))
        validated_at: list[int] = []

        def validate(step_number: int) -> None:
            if data.validation is None:
                return
            if not step.evaluates_held_out:
                step.finish()  # a step that keeps the weights elsewhere hands them back to the model first
            loss = validation_loss(model, data.validation, model_device, recipe.train, placement.reduce_loss, step)
            validated_at.append(step_number)
            session.say(f"step {step_number}: validation loss {loss:.4f} ({len(data.validation)} batches)")
            session.write_scalars(step_number, {"validation_loss": loss})

        def after_step(step_number: int) -> None:
            if recipe.data.validation_every and step_number % recipe.data.validation_every == 0:
                validate(step_number)

        def at_end(summary: TrainSummary) -> None:
            finished = summary.steps_done > start_step and not summary.interrupted and not summary.stopped_because
            if finished and summary.steps_done not in validated_at:
                validate(summary.steps_done)

        session.say(
            f"lane [bold]{backend.lane}[/] on {backend.device(info.local_rank)}, "
            + (f"{recipe.model.family} {recipe.model.flavor}" if pretrained is None else recipe.model.family)
            + f": {parameters:,} parameters"
            + (f" from {escape(pretrained.describe())}" if pretrained is not None else "")
            + f"; layout {placement.describe(recipe.parallel, info.world_size)}"
            + f"; step {describe_step(recipe.train, backend)}; run directory {session.run_dir}"
        )
        session.say(data.describe())
        if tokenizer_note is not None:
            session.say(f"[bold yellow]note[/]: {escape(tokenizer_note)}")
        summary = session.train(
            batches,
            flops_per_token=model.flops_per_token(recipe.data.seq_len),
            data_parallel=placement.data_world,
            reduce_loss=placement.reduce_loss,
            after_step=after_step,
            at_end=at_end,
        )

        def extras_at(loss: float | None) -> HFExtras:
            sequences = data_config.batch_size * recipe.train.grad_accum_steps * placement.data_world  # every rank
            tokens = summary.steps_done * sequences * recipe.data.seq_len
            return training_extras(recipe.to_dict(), recipe.model.family, parameters, summary.steps_done, tokens, loss)

        def write_weights() -> Path:
            return write_trained_weights(session, placement, recipe, summary, extras_at).weights

        weights_path = session.save_final_weights(summary, write_weights)
    return PretrainResult(
        session.run_dir, summary, weights_path, backend.lane, parameters, describe_step(recipe.train, backend)
    )


def describe_step(train_config: TrainConfig, backend: Backend | None = None) -> str:
    """The step mode in words, e.g. ``whole_step (memory policy recompute, compiler auto)``; a single-controller
    backend (the xla lane) compiles the whole step with ``jax.jit``."""
    if backend is not None and backend.single_controller:
        return f"whole_step (jax.jit, memory policy {train_config.memory_policy})"
    if train_config.step_mode == "eager":
        return "eager"
    if train_config.step_mode == "per_block":
        return f"per_block (compiler {train_config.compiler})"
    return f"whole_step (memory policy {train_config.memory_policy}, compiler {train_config.compiler})"
