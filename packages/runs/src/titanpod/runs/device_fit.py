"""Before a run builds anything on an accelerator: does its plan fit the device it is on?

The dry-run planner (``titanpod.recipes.planner``) works out the bytes a device needs for the recipe on the
devices the job has, on the lane it runs; the device reports its own capacity (``Backend.memory_stats``). Where
the plan needs more than the device holds, the run is refused before any model is built, naming the changes
the planner finds that fit. Where the device reports no capacity (the CPU, a torch_tpu without memory
statistics) nothing is checked here; the xla step still says plainly what the allocator refuses
(``titanpod.graph.xla.fit``).

The bar is the whole capacity, not the dry run's margin: a plan the planner puts just under it may still run
(measured on a v5e: the planner within 5% of the compiler for recompute and selective, ``save`` 18% low), and a
refusal here must be sure.
"""

from __future__ import annotations

import dataclasses

from titanpod.device import Backend, process_info
from titanpod.parallel import PlanError
from titanpod.recipes.planner.plan import RunPlan, plan_run
from titanpod.recipes.planner.report import suggestions
from titanpod.recipes.recipe import Recipe

GIB = 1024**3


class RecipeDoesNotFitDevice(ValueError):
    """The recipe's plan needs more bytes a device than the device the run is on holds; nothing was built."""


def job_devices(backend: Backend) -> int:
    """Devices the job trains on: every local device for one controller, else one a process."""
    return backend.device_count() if backend.single_controller else process_info().world_size


def check_recipe_fits_device(recipe: Recipe, backend: Backend) -> RunPlan | None:
    """Refuse ``recipe`` (``RecipeDoesNotFitDevice``) when its plan on the job's devices needs more than the
    device's reported capacity; the plan, or ``None`` where the device reports none or the planner cannot plan
    this layout (the runner's own checks then speak)."""
    stats = backend.memory_stats(process_info().local_rank)
    if stats.kind != "device" or not stats.limit_bytes:
        return None
    chip = backend.chip()
    chips = max(1, job_devices(backend) // chip.devices_per_chip)
    on_this_lane = dataclasses.replace(recipe, device=dataclasses.replace(recipe.device, lane=backend.lane))
    try:
        plan = plan_run(on_this_lane, chip, chips, recipe.target.mfu)
    except (PlanError, ValueError):
        return None
    if plan.memory.total > stats.limit_bytes:
        raise RecipeDoesNotFitDevice(refusal(plan, stats.limit_bytes, on_this_lane, chips))
    return plan


def refusal(plan: RunPlan, capacity: int, recipe: Recipe, chips: int) -> str:
    """Why ``plan`` does not fit a device of ``capacity`` bytes, and the planned changes that do."""
    memory = plan.memory
    parts = (
        f"parameters {memory.parameters / GIB:.2f}, gradients {memory.gradients / GIB:.2f}, optimizer "
        f"{memory.optimizer / GIB:.2f}, activations {memory.activations / GIB:.2f}, "
        f"working {memory.transient / GIB:.2f}"
    )
    fitting = [s.flags for s in suggestions(recipe, plan.chip, chips, recipe.target.mfu) if s.plan.fits]
    advice = (
        "; or ".join(fitting)
        if fitting
        else "a smaller model, a smaller batch or more devices (--dry-run shows each change's figure)"
    )
    return (
        f"{recipe.name} needs {memory.total / GIB:.2f} GiB a device as planned on {plan.chips_text()} ({parts}), "
        f"and this device holds {capacity / GIB:.2f} GiB. Nothing was built. Changes that fit: {advice}."
    )
