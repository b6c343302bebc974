"""What a pretraining run does differently with pipeline stages (``parallel.pp`` > 1)."""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

from titanpod.device import Backend
from titanpod.kernels import model_ops
from titanpod.models import RegionValues, Transformer, build_model
from titanpod.parallel import PLANS, PlanError
from titanpod.parallel.torch_executor import PipelineModel, parallelize_pipeline
from titanpod.parallel.torch_executor.pipeline_gather import gather_pipeline_weights
from titanpod.recipes.recipe import Recipe


def with_pipeline_microbatches(recipe: Recipe) -> Recipe:
    """The recipe with ``train.grad_accum_steps`` set to the pipeline's micro-batches when pp > 1 and it was left
    at 1: ``parallel.pp_microbatches`` when set, else pp (the fewest 1F1B runs); otherwise the recipe as it is.

    A step's micro-batches are the schedule's, so each holds ``data.batch_size`` rows, as with gradient
    accumulation. Validation, which runs the whole model on every rank, is refused with pp > 1.
    """
    parallel = recipe.parallel
    if parallel.pp <= 1:
        return recipe
    if recipe.data.has_validation:
        raise PlanError(
            "Validation runs the whole model on one rank, which a pipeline (parallel.pp > 1) does not hold; "
            "set data.validation_fraction to 0 (and data.validation_split to none) to train with pp."
        )
    if recipe.train.grad_accum_steps != 1:
        return recipe
    microbatches = parallel.pp_microbatches or parallel.pp
    return dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, grad_accum_steps=microbatches))


def check_pipeline_lane(recipe: Recipe, backend: Backend) -> None:
    """``PlanError`` naming the fix when pp > 1 on a lane whose executor builds no pipeline stages (xla, torch_xla)."""
    if recipe.parallel.pp > 1 and (backend.single_controller or backend.lane == "torch_xla"):
        raise PlanError(
            f"parallel.pp={recipe.parallel.pp} on the {backend.lane} lane: pipeline stages run with the torch executor "
            "under torchrun (cpu, cuda, tpu lanes); set device.lane to one of those, or parallel.pp to 1."
        )


def build_pipeline(
    model: Transformer, recipe: Recipe, backend: Backend, initial_values: RegionValues | None
) -> PipelineModel:
    """This rank's stages of ``model``, sharded by its family's plan over its pp rank's sub-mesh."""
    plan = PLANS[recipe.model.family]
    return parallelize_pipeline(model, plan, recipe.parallel, backend, recipe.train.grad_accum_steps, initial_values)


def whole_model_on_writer(pipeline: PipelineModel, recipe: Recipe) -> Transformer | None:
    """The whole trained model on global rank 0, its weights gathered from every stage (on the host), for the
    final export; ``None`` on every other rank. A collective: every rank calls it."""
    weights = gather_pipeline_weights(pipeline)
    if weights is None or dist.get_rank() != 0:
        return None
    model = build_model(recipe.model.family, recipe.model.args(), model_ops(recipe.kernels))
    model.load_state_dict(weights, strict=True, assign=True)
    return model
