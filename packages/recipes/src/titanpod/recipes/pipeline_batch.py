"""The batch a step trains on with pipeline stages: the recipe's, split into the pipeline's micro-batches.

``data.batch_size`` is the sequences a data rank trains on a step (``x train.grad_accum_steps``), whatever the
pipeline degree and schedule; the runner and the dry run both plan a pipeline from the recipe this returns.
"""

from __future__ import annotations

import dataclasses

from titanpod.parallel import PlanError
from titanpod.recipes.recipe import Recipe


def with_pipeline_microbatches(recipe: Recipe) -> Recipe:
    """The recipe as a pipeline runs it when pp > 1; otherwise the recipe as it is.

    A step trains on ``data.batch_size x train.grad_accum_steps`` sequences a data rank, with pipeline stages as
    without: the stages do not change the batch. The pipeline splits those sequences into its micro-batches:
    ``parallel.pp_microbatches`` when set, else ``train.grad_accum_steps`` when above 1, else pp (the fewest 1F1B
    runs). The recipe that comes back holds the same sequences a step as ``grad_accum_steps`` = the micro-batches
    of ``batch_size`` = the sequences / micro-batches each (``PlanError`` when they do not divide). Validation,
    which runs the whole model on every rank, is refused with pp > 1.
    """
    parallel = recipe.parallel
    if parallel.pp <= 1:
        return recipe
    if recipe.data.has_validation:
        raise PlanError(
            "Validation runs the whole model on one rank, which a pipeline (parallel.pp > 1) does not hold; "
            "set data.validation_fraction to 0 (and data.validation_split to none) to train with pp."
        )
    accumulated = recipe.train.grad_accum_steps
    sequences = recipe.data.batch_size * accumulated
    microbatches = parallel.pp_microbatches or (accumulated if accumulated > 1 else parallel.pp)
    if sequences % microbatches:
        raise PlanError(
            f"A step trains on {sequences} sequence(s) a data rank (data.batch_size {recipe.data.batch_size} x "
            f"train.grad_accum_steps {accumulated}), which do not split into {microbatches} pipeline micro-batches "
            f"({'parallel.pp_microbatches' if parallel.pp_microbatches else 'parallel.pp'}); set "
            "parallel.pp_microbatches to a divisor of them (at least pp), or data.batch_size to a multiple of it."
        )
    return dataclasses.replace(
        recipe,
        data=dataclasses.replace(recipe.data, batch_size=sequences // microbatches),
        train=dataclasses.replace(recipe.train, grad_accum_steps=microbatches),
    )
