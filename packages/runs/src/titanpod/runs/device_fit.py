"""Before a run builds anything on an accelerator: does its plan fit the device it is on?

The dry-run planners (``titanpod.recipes.planner``: pretraining and SFT's decoder plan, FLUX's, GRPO's) work out
the bytes a device needs for the recipe on the devices the job has, on the lane it runs; the device reports its
own capacity (``Backend.memory_stats``): an accelerator its memory (from the chip table where it reports no use,
as torch_tpu on an older libtpu), the CPU its host's memory shared by the job's processes on it. Where the plan
needs more than that, the run is refused before any model is built, naming the changes the planner finds that
fit. Where no capacity is known nothing is checked here; the xla step still says plainly what the allocator
refuses, and a compiled whole step what its compiler refuses (``titanpod.graph.device_full``).

The bar is the whole capacity, not the dry run's margin: a plan the planner puts just under it may still run
(measured on a v5e: the planner within 5% of the compiler for recompute and selective, ``save`` 18% low), and a
refusal here must be sure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from titanpod.device import Backend, ChipSpec, process_info
from titanpod.models import DecoderArgs
from titanpod.parallel import PlanError
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.planner.flux import plan_flux
from titanpod.recipes.planner.grpo import plan_grpo
from titanpod.recipes.planner.plan import MemoryPlan, RunPlan, plan_run, with_changes
from titanpod.recipes.planner.report import suggestions
from titanpod.recipes.posttrain.grpo_recipe import GRPORecipe
from titanpod.recipes.posttrain.sft_recipe import SFTRecipe
from titanpod.recipes.recipe import DataConfig, ModelConfig, Recipe

GIB = 1024**3
AnyRecipe = TypeVar("AnyRecipe")


class RecipeDoesNotFitDevice(ValueError):
    """The recipe's plan needs more bytes a device than the device the run is on holds; nothing was built."""


@dataclasses.dataclass(frozen=True)
class DeviceCapacity:
    """The device a run is on, as the planners take it: its bytes, its kind, and the chips of the job."""

    limit_bytes: int
    """What one device holds (``MemoryStats.limit_bytes``)."""
    chip: ChipSpec
    """The chip's kind."""
    chips: int
    """Chips the job trains on."""
    holder: str = "this device"
    """What holds ``limit_bytes``, in words."""


def job_devices(backend: Backend) -> int:
    """Devices the job trains on: every local device for one controller, else one a process."""
    return backend.device_count() if backend.single_controller else process_info().world_size


def device_capacity(backend: Backend) -> DeviceCapacity | None:
    """The device's capacity and the job's chips, or ``None`` where no capacity is known: an accelerator's memory
    (also where it reports no use, its chip's), or for the host its memory shared by the job's processes on it."""
    info = process_info()
    stats = backend.memory_stats(info.local_rank)
    if not stats.limit_bytes or stats.kind not in ("device", "unavailable", "host"):
        return None
    limit, holder = stats.limit_bytes, "this device"
    if stats.kind == "host":
        sharing = max(1, info.local_world_size)
        limit //= sharing
        holder = "this machine's memory" + (f" (a share of {sharing} processes)" if sharing > 1 else "")
    chip = backend.chip()
    return DeviceCapacity(limit, chip, max(1, job_devices(backend) // chip.devices_per_chip), holder)


def on_lane(recipe: AnyRecipe, backend: Backend) -> AnyRecipe:
    """``recipe`` with its lane set to the one the run is on (a recipe may say ``auto``)."""
    device = dataclasses.replace(recipe.device, lane=backend.lane)  # type: ignore[attr-defined]
    return dataclasses.replace(recipe, device=device)  # type: ignore[type-var]


def memory_parts(memory: MemoryPlan) -> str:
    """A plan's bytes by kind, in GiB."""
    return (
        f"parameters {memory.parameters / GIB:.2f}, gradients {memory.gradients / GIB:.2f}, optimizer "
        f"{memory.optimizer / GIB:.2f}, activations {memory.activations / GIB:.2f}, "
        f"working {memory.transient / GIB:.2f}"
    )


def refusal(
    name: str, needed: int, where: str, parts: str, capacity: int, fitting: Sequence[str], holder: str = "this device"
) -> str:
    """Why a plan needing ``needed`` bytes does not fit ``holder``'s ``capacity``, and the changes that do."""
    advice = (
        "; or ".join(fitting)
        if fitting
        else "a smaller model, a smaller batch or more devices (--dry-run shows each change's figure)"
    )
    return (
        f"{name} needs {needed / GIB:.2f} GiB a device as planned on {where} ({parts}), and {holder} holds "
        f"{capacity / GIB:.2f} GiB. Nothing was built. Changes that fit: {advice}."
    )


def check_recipe_fits_device(recipe: Recipe, backend: Backend, args: DecoderArgs | None = None) -> RunPlan | None:
    """Refuse ``recipe`` (``RecipeDoesNotFitDevice``) when its plan on the job's devices needs more than the
    device's reported capacity; the plan, or ``None`` where the device reports none or the planner cannot plan
    this layout (the runner's own checks then speak). ``args``: the model's shape when not the recipe flavor's
    (a checkpoint's)."""
    capacity = device_capacity(backend)
    if capacity is None:
        return None
    ours = on_lane(recipe, backend)
    try:
        plan = plan_run(ours, capacity.chip, capacity.chips, recipe.target.mfu, args)
    except (PlanError, ValueError):
        return None
    if plan.memory.total > capacity.limit_bytes:
        found = suggestions(ours, plan.chip, capacity.chips, recipe.target.mfu, args=args)
        fitting = [s.flags for s in found if s.plan.fits]
        raise RecipeDoesNotFitDevice(
            refusal(
                recipe.name,
                plan.memory.total,
                plan.chips_text(),
                memory_parts(plan.memory),
                capacity.limit_bytes,
                fitting,
                capacity.holder,
            )
        )
    return plan


def check_sft_fits_device(recipe: SFTRecipe, backend: Backend, args: DecoderArgs) -> RunPlan | None:
    """``check_recipe_fits_device`` for a fine-tuning run of a model of shape ``args`` (the checkpoint's, or the
    recipe flavor's): planned as pretraining of that model on rows of ``data.seq_len`` tokens, which is the step
    SFT runs (its loss masks the prompt's tokens, which changes no byte)."""
    if device_capacity(backend) is None:
        return None
    try:
        planned = Recipe(
            name=recipe.name,
            device=recipe.device,
            train=recipe.train,
            checkpoint=recipe.checkpoint,
            output=recipe.output,
            model=ModelConfig(family=recipe.model.family, flavor=recipe.model.flavor),
            parallel=recipe.parallel,
            kernels=recipe.kernels,
            data=DataConfig(seq_len=recipe.data.seq_len, batch_size=recipe.data.batch_size),
        )
    except (KeyError, ValueError):  # a recipe pretraining would not take: the planner cannot plan it
        return None
    return check_recipe_fits_device(planned, backend, args)


Change = tuple[str, Callable[[Any], Any]]
"""A change a refusal may suggest: its flags, and the recipe with it made."""


def _recompute(recipe: Any) -> list[Change]:
    """Recomputing every block's activations, where the recipe does not yet (it needs the whole step)."""
    if recipe.train.memory_policy == "recompute":
        return []
    flags = "--train.memory-policy recompute"
    values = {"memory_policy": "recompute"}
    if recipe.train.step_mode != "whole_step":
        flags, values = f"--train.step-mode whole_step {flags}", {**values, "step_mode": "whole_step"}
    return [(flags, lambda r: with_changes(r, train=values))]


def _fitting(changes: Sequence[Change], recipe: Any, needs: Callable[[Any], int], capacity: int) -> list[str]:
    """The flags of each change whose plan fits ``capacity`` (a change the planner refuses is left out)."""
    found = []
    for flags, change in changes:
        try:
            if needs(change(recipe)) <= capacity:
                found.append(flags)
        except (PlanError, ValueError):
            continue
    return found


def check_diffusion_fits_device(recipe: DiffusionRecipe, backend: Backend) -> int | None:
    """``check_recipe_fits_device`` for a FLUX recipe (``plan_flux``: the transformer's training bytes and the
    frozen encoders); the planned bytes, or ``None`` where nothing was checked."""
    capacity = device_capacity(backend)
    if capacity is None:
        return None
    ours = on_lane(recipe, backend)

    def needs(candidate: DiffusionRecipe) -> int:
        return plan_flux(candidate, capacity.chip, capacity.chips, candidate.target.mfu).total_bytes

    try:
        plan = plan_flux(ours, capacity.chip, capacity.chips, recipe.target.mfu)
    except (PlanError, ValueError):
        return None
    if plan.total_bytes <= capacity.limit_bytes:
        return plan.total_bytes
    half = recipe.data.batch_size // 2
    changes = _recompute(recipe)
    if half >= 1:
        changes.append((f"--data.batch-size {half}", lambda r: with_changes(r, data={"batch_size": half})))
    fitting = _fitting(changes, ours, needs, capacity.limit_bytes)
    parts = f"{memory_parts(plan.memory)}, frozen encoders {plan.frozen_encoders / GIB:.2f}"
    where = f"{capacity.chips} x {capacity.chip.name}"
    raise RecipeDoesNotFitDevice(
        refusal(recipe.name, plan.total_bytes, where, parts, capacity.limit_bytes, fitting, capacity.holder)
    )


def check_grpo_fits_device(
    recipe: GRPORecipe, family: str, args: DecoderArgs, backend: Backend, seq_len: int
) -> int | None:
    """``check_recipe_fits_device`` for a GRPO run (``plan_grpo``: the trainer, the KL reference and the rollout
    engine on one device) of the policy ``family`` / ``args`` at rows of ``seq_len`` positions; the planned
    bytes, or ``None`` where nothing was checked."""
    capacity = device_capacity(backend)
    if capacity is None:
        return None
    devices = job_devices(backend)

    def needs(candidate: GRPORecipe) -> int:
        return plan_grpo(candidate, family, args, devices, seq_len).total

    try:
        plan = plan_grpo(recipe, family, args, devices, seq_len)
    except (PlanError, ValueError):
        return None
    if plan.total <= capacity.limit_bytes:
        return plan.total
    accumulate = recipe.train.grad_accum_steps * 2
    prompts = recipe.grpo.prompts_per_step // 2
    changes = _recompute(recipe)
    if plan.engine_rows % accumulate == 0:  # each micro-batch a whole share of the rows
        more = {"grad_accum_steps": accumulate}
        changes.append((f"--train.grad-accum-steps {accumulate}", lambda r: with_changes(r, train=more)))
    if prompts >= 1:
        fewer = {"prompts_per_step": prompts}
        changes.append((f"--grpo.prompts-per-step {prompts}", lambda r: with_changes(r, grpo=fewer)))
    fitting = _fitting(changes, recipe, needs, capacity.limit_bytes)
    parts = (
        f"trainer {plan.trainer.total / GIB:.2f} ({memory_parts(plan.trainer)}), KL reference "
        f"{plan.reference / GIB:.2f}, rollout engine {plan.engine / GIB:.2f}, weight sync "
        f"{plan.sync_transient / GIB:.2f}"
    )
    where = f"{devices} x {capacity.chip.name}"
    raise RecipeDoesNotFitDevice(
        refusal(recipe.name, plan.total, where, parts, capacity.limit_bytes, fitting, capacity.holder)
    )
