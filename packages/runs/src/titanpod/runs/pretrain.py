"""Building a pretraining run from a recipe and running it to the end."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from rich.console import Console

from titanpod.checkpoint import complete_checkpoints, save_hf_checkpoint, save_model
from titanpod.data import TrainData, build_data, gather_data_state
from titanpod.device import Backend, get_backend, process_info
from titanpod.graph import TrainConfig, TrainSummary, build_step
from titanpod.kernels import model_ops
from titanpod.models import RegionValues, Transformer, parameter_count, region_initializer
from titanpod.parallel import DATA_AXES, check_sequence_length
from titanpod.parallel.torch_executor import parallelize
from titanpod.recipes.families import build_model, hf_adapter, sharding_plan
from titanpod.recipes.recipe import NamedRun, Recipe
from titanpod.runs.hf_export import training_extras
from titanpod.runs.init_from import build_pretrained_model, pretrained_for
from titanpod.runs.pipelined import (
    PipelineTensors,
    build_pipeline,
    check_pipeline_lane,
    whole_model_on_writer,
    with_pipeline_microbatches,
)
from titanpod.runs.process_count import check_process_count
from titanpod.runs.session import RunSession
from titanpod.runs.session import prepare_run_dir as prepare_run_dir  # re-exported: runners import it from here
from titanpod.runs.torch_xla_spmd import start_spmd
from titanpod.runs.validation import validation_loss

ENTRY_MODULE = "titanpod.pretrain.cli"
"""The module torchrun starts for a pretraining job (``titanpod-pretrain``)."""

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


def latest_resumable_run(recipe: NamedRun) -> str | None:
    """Name of the newest run directory of ``recipe`` (``<name>-<timestamp>``) holding a complete checkpoint."""
    runs = Path(recipe.output.runs_dir)
    candidates = [
        run for run in runs.glob(f"{recipe.name}-*") if run.is_dir() and complete_checkpoints(run / "checkpoints")
    ]
    return max(candidates, key=lambda run: run.name).name if candidates else None


def with_resume(recipe: ResumableRun) -> ResumableRun:
    """``--resume``: the recipe set to continue its run (``--output.run-name``, else the newest
    run of this recipe under ``--output.runs-dir`` that has a complete checkpoint). With
    ``--checkpoint.dir`` the checkpoints are found there, so no earlier run directory is needed
    (without one, the resumed run writes its metrics to a new run directory).

    ``ValueError`` when there is no such run, saying how to name one or start afresh, and with
    ``--output.start-over``, which asks for the opposite.
    """
    if recipe.output.start_over:
        raise ValueError(
            "--resume continues a run and --output.start-over moves its files aside to start a new one: "
            "give one of them."
        )
    run_name = recipe.output.run_name or latest_resumable_run(recipe)
    if run_name is None and not recipe.checkpoint.dir:
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
    model.to_empty(device=backend.parameter_device(process_info().local_rank))
    model.init_weights(recipe.train.seed)
    return model


def build_seeded_model(recipe: Recipe, backend: Backend) -> tuple[Transformer, RegionValues | None]:
    """The recipe's model initialised from ``train.seed``, and what to create it from when it is still to be sharded.

    Under torchrun, and on a single-controller lane (the xla lane), the model stays on the meta device and
    the region init of the seed comes back (``titanpod.models.region_initializer``): hand it to
    ``parallelize`` (or the xla step) as ``initial_values``, so each rank (each device) creates only its own
    shards and no host ever holds the whole model; the values equal one process's ``init_weights`` bit for
    bit. One process: materialised and initialised whole (``build_initialised_model``); ``None`` comes back.
    """
    if process_info().world_size > 1 or backend.single_controller:
        model = build_model(recipe.model.family, recipe.model.args(), model_ops(recipe.kernels))
        return model, region_initializer(model, recipe.train.seed)
    return build_initialised_model(recipe, backend), None


def run_pretraining(recipe: Recipe, console: Console | None = None) -> PretrainResult:
    """Train the recipe's model on its data and write metrics and weights to a new run directory.

    Under torchrun the model is sharded by its family's plan and ``recipe.parallel`` (with pp > 1, cut into
    pipeline stages first: ``titanpod.runs.pipelined``); only rank 0 prints and writes.
    """
    recipe = with_pipeline_microbatches(recipe)
    info = process_info()
    backend = get_backend(recipe.device.lane)
    check_pipeline_lane(recipe, backend)
    spmd = start_spmd(recipe, backend, info.world_size)  # torch_xla over several devices: before any xla tensor
    if spmd is None:
        check_process_count(recipe.parallel, backend, info.world_size, ENTRY_MODULE)  # before any work
    check_sequence_length(recipe.data.seq_len, recipe.parallel.cp)
    torch.manual_seed(recipe.train.seed)
    pretrained = pretrained_for(recipe)  # a folder that does not fit fails before anything is built
    if pretrained is None:
        model, initial_values = build_seeded_model(recipe, backend)
    else:  # under torchrun: still on the meta device, each rank's shards read from the folder by parallelize
        model, initial_values = build_pretrained_model(recipe, backend, pretrained, console)
    parameters = parameter_count(model)
    sharded, xla_axes, pipeline = None, None, None
    data_config = recipe.data
    if backend.single_controller:  # one controller drives every device; the compiler partitions by the plan
        xla_axes = recipe.parallel.mesh_axes(backend.device_count())
        data_rank, data_world = 0, 1
        # batch_size is per data rank: this one process loads the batch of every data rank of the mesh.
        data_degree = math.prod(xla_axes[axis] for axis in DATA_AXES)
        data_config = dataclasses.replace(recipe.data, batch_size=recipe.data.batch_size * data_degree)
    elif spmd is not None:  # one process drives the mesh; XLA partitions by the plan's annotations
        spmd.shard(model, recipe)
        data_rank, data_world = 0, 1
        data_config = dataclasses.replace(recipe.data, batch_size=recipe.data.batch_size * spmd.data_degree)
    elif info.world_size > 1 and recipe.parallel.pp > 1:
        pipeline = build_pipeline(model, recipe, backend, initial_values)
        sharded = pipeline.sharded
        data_rank, data_world = sharded.data_rank, sharded.data_world
    elif info.world_size > 1:
        sharded = parallelize(model, sharding_plan(recipe.model.family), recipe.parallel, backend, initial_values)
        data_rank, data_world = sharded.data_rank, sharded.data_world
    else:
        data_rank, data_world = 0, 1
    data = build_data(data_config, model.args.vocab_size, recipe.train.seed, data_rank, data_world)
    batches = data.train
    reduce = None if sharded is None else sharded.mean_over_data
    model_device = backend.parameter_device(info.local_rank)
    trained = model if pipeline is None else pipeline.model  # a pipeline rank trains and saves its stages alone
    with RunSession(recipe, backend, console) as session:
        plan = sharding_plan(recipe.model.family)  # the xla step creates a meta model's parameters from initial_values
        step = build_step(
            trained,
            recipe.train,
            backend,
            plan=plan,
            axes=xla_axes,
            initial_values=initial_values,
            pipeline=pipeline,
            gather_dtype=getattr(torch, recipe.parallel.param_dtype),  # FSDP gathers in the plan's dtype
        )
        start_step = session.resume(trained, step, batches, data_state=lambda: gather_data_state(batches))
        validated_at: list[int] = []

        def validate(step_number: int) -> None:
            if data.validation is None:
                return
            step.finish()  # a single-controller step hands its trained weights back to the (host) model first
            loss = validation_loss(model, data.validation, model_device, recipe.train, reduce)
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
            f"{recipe.model.family} {recipe.model.flavor}: {parameters:,} parameters"
            + (f" from {recipe.model.init_from}" if pretrained is not None else "")
            + f"; step {describe_step(recipe.train, backend)}; run directory {session.run_dir}"
        )
        session.say(data.describe())
        summary = session.train(
            batches,
            flops_per_token=model.flops_per_token(recipe.data.seq_len),
            data_parallel=data_world,
            reduce_loss=reduce,
            after_step=after_step,
            at_end=at_end,
        )

        def write_weights() -> Path:
            sequences = data_config.batch_size * recipe.train.grad_accum_steps * data_world  # a step, every rank
            tokens = summary.steps_done * sequences * recipe.data.seq_len
            loss = summary.reports[-1].loss if summary.reports else None  # as metrics.jsonl logs it last
            extras = training_extras(
                recipe.to_dict(), recipe.model.family, parameters, summary.steps_done, tokens, loss
            )
            weights = save_model(
                model,
                recipe.model.family,
                session.run_dir / "model",
                {"step": summary.steps_done},
                extra_files={"recipe.json": recipe.to_json(), **extras.tokenizer_files},
                special_tokens=extras.special_tokens,
                about=extras.about,
                source=None if pipeline is None else PipelineTensors(pipeline, model),  # stage by stage to rank 0
            )
            if recipe.checkpoint.export_hf:  # with pp: gathered whole in rank 0's host memory (None elsewhere)
                whole = model if pipeline is None else whole_model_on_writer(pipeline, recipe)
                if whole is not None:
                    hf_path = save_hf_checkpoint(
                        whole,
                        hf_adapter(recipe.model.family),
                        session.run_dir / "hf",
                        special_tokens=extras.special_tokens,
                        extra_files=extras.hf_files(),
                    )
                    session.say(f"exported the model as a Hugging Face checkpoint: {hf_path}")
            return weights

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
