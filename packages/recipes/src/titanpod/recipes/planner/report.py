"""The dry run for people: the plan as a table, and what to change when it does not fit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from titanpod.device import ChipSpec, backend_class, cached_cpu_peak, chip_by_name
from titanpod.models import DecoderArgs
from titanpod.parallel import PlanError
from titanpod.recipes.planner.host_table import add_host_row, print_host
from titanpod.recipes.planner.plan import FIT_FRACTION, RunPlan, plan_run, with_changes
from titanpod.recipes.recipe import Recipe

GiB = 1024**3


@dataclass(frozen=True)
class Suggestion:
    """One change to a recipe that lowers memory per device (or per worker VM), with the plan it gives."""

    flags: str
    """The command-line flags that make the change."""
    plan: RunPlan
    """The plan with the change."""


def plan_table(plan: RunPlan) -> Table:
    """The plan as a two-column table: parameters, FLOPs, memory per device and per host, step time."""
    memory = plan.memory
    table = Table(title=f"dry run: {plan.recipe} on {plan.chips_text()}", show_header=False)
    table.add_row("model", plan.model)
    params = f"{plan.parameters:,} ({plan.parameters / 1e9:.3f}B)"
    if plan.active_parameters != plan.parameters:
        params += f"; {plan.active_parameters / 1e9:.2f}B active per token"
    table.add_row("parameters", params)
    table.add_row("FLOPs per token", f"{plan.flops_per_token / 1e9:,.2f} GFLOP (6N + attention, training)")
    table.add_row("mesh", " x ".join(f"{axis} {size}" for axis, size in plan.mesh.items() if size > 1) or "one device")
    table.add_row(
        "batch",
        f"{plan.batch_per_device} x {plan.seq_len} tokens per data rank x {plan.grad_accum_steps} micro-batches; "
        f"{plan.tokens_per_step:,} tokens per step",
    )
    table.add_row("step", f"memory policy {plan.memory_policy}, {plan.precision} compute")
    if plan.pipeline:
        table.add_row("pipeline", f"{plan.pipeline}: idle {plan.pipeline_bubble:.0%} of a step (in the step time)")
    if plan.context_parallel_bytes:
        table.add_row(
            "context parallelism",
            f"{plan.seq_len // plan.mesh['cp']:,} tokens of every row per device; keys and values gathered: "
            f"{plan.context_parallel_bytes / GiB:,.2f} GiB received per device per step",
        )
    table.add_row("memory per device", "")
    table.add_row("  parameters (fp32)", _gib(memory.parameters))
    table.add_row("  gradients (fp32)", _gib(memory.gradients))
    table.add_row("  optimizer state (AdamW, fp32)", _gib(memory.optimizer))
    table.add_row(f"  activations ({plan.memory_policy})", _gib(memory.activations))
    table.add_row("  working memory (backward, gathers)", _gib(memory.transient))
    if memory.host_offload:
        table.add_row("  offloaded to host (not in total)", _gib(memory.host_offload))
    verdict = "[green]fits[/]" if plan.device_fits else "[bold red]does not fit[/]"
    table.add_row(
        "  total",
        f"{_gib(memory.total)} of {plan.chip.memory_bytes / GiB:.1f} GiB "
        f"({memory.total / plan.chip.memory_bytes:.0%}; plans may use {FIT_FRACTION:.0%}): {verdict}",
    )
    table.add_row(
        f"step time at {plan.target_mfu:.0%} MFU",
        f"{plan.step_seconds:.3g} s ({plan.tokens_per_second_per_device:,.0f} tokens/s per device, "
        f"peak {plan.chip.peak_flops / 1e12:,.0f} TFLOP/s per device)",
    )
    add_host_row(table, plan.host)
    return table


def suggestions(
    recipe: Recipe, chip: ChipSpec, chips: int, target_mfu: float, limit: int = 4, args: DecoderArgs | None = None
) -> list[Suggestion]:
    """Changes that lower memory per device, each planned, the ones that fit first (``args``: as ``plan_run``)."""
    train, data, kernels = recipe.train, recipe.data, recipe.kernels
    candidates: list[tuple[str, Recipe, int]] = []
    if recipe.parallel.pp > 1 and not recipe.parallel.pp_recompute:  # pipeline steps run eager: their own recompute
        changed = with_changes(recipe, parallel={"pp_recompute": True})
        candidates.append(("--parallel.pp-recompute", changed, chips))
    elif recipe.parallel.pp == 1 and train.memory_policy in ("save", "selective"):
        flags = "--train.memory-policy recompute"
        if train.step_mode != "whole_step":
            flags += " --train.step-mode whole_step"
        changed = with_changes(recipe, train={"memory_policy": "recompute", "step_mode": "whole_step"})
        candidates.append((flags, changed, chips))
    if data.batch_size > 1:
        half, accum = data.batch_size // 2, train.grad_accum_steps * 2
        changed = with_changes(recipe, data={"batch_size": half}, train={"grad_accum_steps": accum})
        candidates.append((f"--data.batch-size {half} --train.grad-accum-steps {accum}", changed, chips))
    if kernels.head_loss == "reference":
        changed = with_changes(recipe, kernels={"head_loss": "chunked"})
        candidates.append(("--kernels.head-loss chunked", changed, chips))
    if kernels.head_loss == "pallas" and kernels.pallas_loss.keep_logits:
        loss = dataclasses.replace(kernels.pallas_loss, keep_logits=False)
        changed = with_changes(recipe, kernels={"pallas_loss": loss})
        candidates.append(("--kernels.pallas-loss.no-keep-logits", changed, chips))
    if not train.optimizer_offload:  # a lane without the xla step's one JAX program refuses it, and is dropped
        changed = with_changes(recipe, train={"optimizer_offload": True})
        candidates.append(("--train.optimizer-offload", changed, chips))
    candidates.append(_more_chips(recipe, chips))
    found = _planned(candidates, chip, target_mfu, args)
    shorter = _longest_fitting_sequences(recipe, chip, chips, target_mfu, args)
    found += [shorter] if shorter is not None else []
    found.sort(key=lambda s: (not s.plan.fits, s.plan.memory.total))
    return found[:limit]


SEQ_LEN_QUANTUM = 1024
"""The step the longest fitting sequence length is searched in (a multiple of every kernel's block)."""


def _longest_fitting_sequences(
    recipe: Recipe, chip: ChipSpec, chips: int, target_mfu: float, args: DecoderArgs | None = None
) -> Suggestion | None:
    """The longest ``data.seq_len`` (a multiple of ``SEQ_LEN_QUANTUM`` below the recipe's) whose plan fits, all else
    kept; ``None`` when none does or the recipe's length is already the quantum or less."""
    longest = (recipe.data.seq_len - 1) // SEQ_LEN_QUANTUM
    low, high, best = 1, longest, None
    while low <= high:  # memory grows with the length: bisect on the multiples of the quantum
        middle = (low + high) // 2
        seq_len = middle * SEQ_LEN_QUANTUM
        planned = _planned([(f"--data.seq-len {seq_len}", with_changes(recipe, data={"seq_len": seq_len}), chips)],
                           chip, target_mfu, args)  # fmt: skip
        if planned and planned[0].plan.fits:
            best, low = planned[0], middle + 1
        else:
            high = middle - 1
    return best


def _more_chips(recipe: Recipe, chips: int) -> tuple[str, Recipe, int]:
    """Twice the chips, with a fixed FSDP degree doubled too (so the state is split over them all)."""
    fsdp = recipe.parallel.fsdp
    if fsdp < 1:  # fsdp takes whatever devices the other axes leave
        return f"--chips {chips * 2}", recipe, chips * 2
    changed = with_changes(recipe, parallel={"fsdp": fsdp * 2})
    return f"--chips {chips * 2} --parallel.fsdp {fsdp * 2}", changed, chips * 2


def host_suggestions(recipe: Recipe, chip: ChipSpec, chips: int, target_mfu: float) -> list[Suggestion]:
    """Changes that lower host memory per worker VM, each planned, the ones that fit first."""
    plan = plan_run(recipe, chip, chips, target_mfu)
    candidates: list[tuple[str, Recipe, int]] = []
    if recipe.checkpoint.async_save:
        changed = with_changes(recipe, checkpoint={"async_save": False})
        candidates.append(("--checkpoint.no-async-save", changed, chips))
    if recipe.train.memory_policy == "offload":
        changed = with_changes(recipe, train={"memory_policy": "recompute"})
        candidates.append(("--train.memory-policy recompute", changed, chips))
    if (
        plan.host is not None
        and backend_class(plan.host.lane).single_controller
        and not backend_class(chip.auto_lane).device_memory_is_host
    ):
        changed = with_changes(recipe, device={"lane": chip.auto_lane})
        candidates.append((f"--device.lane {chip.auto_lane}", changed, chips))
    if recipe.output.save_weights and not recipe.checkpoint.export_hf:
        changed = with_changes(recipe, output={"save_weights": False})
        candidates.append(("--output.no-save-weights", changed, chips))
    candidates.append((f"--chips {chips * 2}", recipe, chips * 2))
    found = _planned(candidates, chip, target_mfu)
    found = [s for s in found if s.plan.host is not None and s.plan.host.per_host is not None]
    found.sort(key=lambda s: (not s.plan.fits, _host_peak(s.plan)))
    return found


def _host_peak(plan: RunPlan) -> int:
    return plan.host.per_host.peak[1] if plan.host is not None and plan.host.per_host is not None else 0


def _gib(size: int) -> str:
    return f"{size / GiB:,.2f} GiB"


def target_chip(name: str) -> ChipSpec:
    """The ``ChipSpec`` a dry run plans for: a named accelerator, or ``cpu`` (this machine, measured)."""
    if name.lower() == "cpu":
        return cached_cpu_peak()
    return chip_by_name(name)


def dry_run(recipe: Recipe, console: Console, chip: ChipSpec | None = None) -> RunPlan:
    """Plan ``recipe`` on its target slice (of ``chip``, default the target's), print the table and,
    when it does not fit its devices or its hosts, what to change."""
    target = recipe.target
    chip = chip or target_chip(target.chip)
    plan = plan_run(recipe, chip, target.chips, target.mfu)
    console.print(plan_table(plan))
    print_host(console, recipe.name, plan.host)
    if plan.host is not None and plan.host.fits is False:
        console.print("Changes that lower host memory:")
        table = Table("change", "peak per worker VM", "fits", "step time")
        for suggestion in host_suggestions(recipe, chip, target.chips, target.mfu):
            table.add_row(
                suggestion.flags,
                _gib(_host_peak(suggestion.plan)),
                "yes" if suggestion.plan.fits else "no",
                f"{suggestion.plan.step_seconds:.3g} s",
            )
        console.print(table)
    if not plan.device_fits:
        console.print(
            f"[bold red]{recipe.name} needs {_gib(plan.memory.total)} per device; "
            f"{plan.chip.name} has {plan.chip.memory_bytes / GiB:.1f} GiB.[/] Changes that lower it:",
            soft_wrap=True,
        )
        table = Table("change", "memory per device", "fits", "step time")
        for suggestion in suggestions(recipe, chip, target.chips, target.mfu):
            table.add_row(
                suggestion.flags,
                _gib(suggestion.plan.memory.total),
                "yes" if suggestion.plan.fits else "no",
                f"{suggestion.plan.step_seconds:.3g} s",
            )
        console.print(table)
    return plan


def _planned(
    candidates: list[tuple[str, Recipe, int]], chip: ChipSpec, target_mfu: float, args: DecoderArgs | None = None
) -> list[Suggestion]:
    """Each candidate change planned on its chip count; a change the mesh or the model cannot take is dropped."""
    found = []
    for flags, changed, count in candidates:
        try:
            found.append(Suggestion(flags, plan_run(changed, chip, count, target_mfu, args)))
        except (PlanError, ValueError):
            continue
    return found
