"""``--compile-for SLICE`` for people: compile, print the figures as a table, write them as JSON, and exit
non-zero when the step does not fit a chip."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from titanpod.graph.xla.ahead_of_time import NamedBatchShape
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.recipe import Recipe
from titanpod.runs.depth_extrapolation import COST_DEPTHS, extrapolated, with_costs_from
from titanpod.runs.slice_compile import compile_for_slice, target_slice
from titanpod.runs.slice_program import save_executable
from titanpod.runs.slice_report import SliceCompileReport, write_report

GiB = 1024**3


CompileOne = Callable[..., tuple[SliceCompileReport, Any]]
"""``compile_one(recipe, tpu, layers=None, dump_dir=None, say=print)``: one compile of a recipe's step for a
slice, cut to ``layers`` when given (``compile_for_slice`` for the decoder LLMs)."""


def compile_for_command(
    recipe: Recipe | DiffusionRecipe,
    slice_name: str,
    console: Console,
    *,
    layers: tuple[int, ...] = (),
    output_dir: Path | None = None,
    keep_program: bool = False,
    compile_one: CompileOne = compile_for_slice,
    cost_depths: tuple[int, int] = COST_DEPTHS,
) -> int:
    """Compile ``recipe``'s step for the slice ``slice_name`` (``target``: the recipe's own), print and write
    the report; 0 when it fits a chip, 1 when not (saying what dominates), 2 for a request that cannot be met.

    ``layers``: one depth compiles the model cut to that many layers; two (``2,4``) compile both and report the
    whole model's figures extrapolated by depth. Without ``layers``, a recipe with ``train.scan_layers`` is
    compiled at full depth with its blocks as one loop (memory a chip, compile time) and as unrolled copies of
    ``COST_DEPTHS`` layers (flops, time, collectives, extrapolated). ``keep_program`` also writes the optimised
    HLO and the serialised executable beside the report. ``compile_one`` compiles the recipe's kind of step
    (a decoder LLM's by default; ``titanpod.runs.diffusion.slice_compile`` for FLUX), ``cost_depths`` are the
    unrolled depths whose costs a scanned compile takes.
    """
    tpu = target_slice(recipe, slice_name)
    folder = output_dir or Path(recipe.output.runs_dir) / f"compile-{recipe.name}-{tpu.name.replace(' ', '')}"
    if len(layers) > 2 or (len(layers) == 2 and layers[0] >= layers[1]):
        raise ValueError(f"--compile-layers takes one depth or two rising ones (e.g. 2 4); got {layers}.")
    try:  # before the compile, so a folder that cannot be written costs nothing
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--compile-output {folder} cannot be made ({error}); name a folder you can write.") from error
    started = time.perf_counter()
    reports: list[SliceCompileReport] = []
    compiled = None
    costed = not layers and recipe.train.scan_layers
    for depth in layers or ((None, *cost_depths) if costed else (None,)):
        hlo = folder / (f"hlo-{depth}-layers" if depth else "hlo") if keep_program else None
        with console.status(f"compiling {recipe.name} for {tpu.name} ({depth or 'all'} layers) with libtpu ..."):
            try:
                report, compiled = compile_one(recipe, tpu, layers=depth, dump_dir=hlo, say=console.print)
            except Exception as error:
                if HBM_EXHAUSTED not in str(error):
                    raise
                return refused_for_memory(recipe, tpu.name, str(error), folder, console)
        console.print(
            f"compiled {report.layers} layers{' as one loop' if report.scanned else ''} in "
            f"{report.compile_seconds:.1f} s (traced and lowered in {report.trace_seconds:.1f} s)"
        )
        reports.append(report)
    if len(reports) == 3:
        report = with_costs_from(*reports)
    else:
        report = extrapolated(*reports) if len(reports) == 2 else reports[0]
    path = write_report(report, folder / "report.json")
    if keep_program and compiled is not None:
        save_executable(compiled, folder / "executable.bin")
    console.print(slice_table(report))
    console.print(f"report: {path} (all of it in {time.perf_counter() - started:.0f} s)", soft_wrap=True)
    if not report.fits:
        part, size = report.program.memory.largest()
        console.print(
            f"[bold red]does not fit[/]: {report.program.memory.total / GiB:.1f} GiB a chip of "
            f"{report.chip_hbm / GiB:.1f}; the largest part is {part} at {size / GiB:.1f} GiB. Shard more "
            "(parallel.fsdp / tp), recompute more (train.memory_policy recompute), or take a smaller "
            "data.batch_size with more train.grad_accum_steps."
        )
        return 1
    return 0


HBM_EXHAUSTED = "CompileTimeHbmOom"
"""What libtpu's error says when it cannot place a program's buffers in a chip's HBM at all."""


def refused_for_memory(
    recipe: Recipe | DiffusionRecipe, slice_name: str, message: str, folder: Path, console: Console
) -> int:
    """The compiler refused the step for want of HBM: say so with its own words, write a report saying it does
    not fit, and return 1 (as for a step that compiled and does not fit)."""
    detail = next((line.strip() for line in message.splitlines() if "HBM" in line), message.strip()[:300])
    path = folder / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"recipe": recipe.name, "slice": slice_name, "fits": False, "error": detail}) + "\n")
    console.print(
        f"[bold red]does not fit[/]: libtpu could not place the step in a chip's HBM ({detail}). Shard more "
        "(parallel.fsdp / tp), recompute more (train.memory_policy recompute), or take a smaller data.batch_size "
        f"with more train.grad_accum_steps. Report: {path}",
        soft_wrap=True,
    )
    return 1


def slice_table(report: SliceCompileReport) -> Table:
    """The report as a two-column table, a chip's figures with the planner's beside the compiler's."""
    memory = report.program.memory
    depth = f"{report.layers} layers"
    if report.extrapolated_from:
        depth += f" (extrapolated from compiles of {' and '.join(map(str, report.extrapolated_from))})"
    elif report.layers != report.model_layers:
        depth += f" of {report.model_layers} (a shallow copy)"
    if report.scanned:
        depth += ", blocks as one loop"
    table = Table(title=f"{report.recipe} compiled for {report.slice} by libtpu", show_header=False)
    table.add_row("program", f"{depth}; mesh " + " x ".join(f"{a} {n}" for a, n in report.mesh.items()))
    table.add_row("memory from", report.sources["memory"])
    table.add_row("flops, time, collectives from", report.sources["cost"])
    table.add_row("batch", batch_words(report))
    table.add_row("kernels", ", ".join(f"{slot} {name}" for slot, name in report.kernels.items()))
    table.add_row("HBM a chip (compiler)", "")
    table.add_row("  arguments", _gib(memory.arguments))
    table.add_row("  temporaries", _gib(memory.temporaries))
    table.add_row("  outputs not aliased", _gib(memory.outputs - memory.aliased))
    table.add_row("  code", _gib(memory.code))
    verdict = "[green]fits[/]" if report.fits else "[bold red]does not fit[/]"
    table.add_row("  total", f"{_gib(memory.total)} of {report.chip_hbm / GiB:.1f} GiB: {verdict}")
    table.add_row("HBM a chip (planner)", f"{_gib(report.planner_bytes)} ({report.planner_difference:+.1%})")
    table.add_row(
        "flops a chip",
        f"{report.program.flops / 1e12:,.1f} TFLOP compiler / {report.model_flops_per_chip / 1e12:,.1f} model "
        f"= {report.flops_ratio:.2f}",
    )
    if report.step_seconds is not None:
        table.add_row(
            "step (compiler's estimate)",
            f"{report.step_seconds:.3f} s: {throughput_words(report)}, est. MFU {report.estimated_mfu:.1%}",
        )
    if report.program.collectives:
        table.add_row("collectives a step", "")
    for kind, collective in report.program.collectives.items():
        table.add_row(f"  {kind}", f"{collective.count} ops, {collective.bytes / GiB:,.2f} GiB a step")
    if report.program.while_loops:
        table.add_row("while loops", f"{report.program.while_loops} (each body counted once in flops and time)")
    compile_time = f"{report.compile_seconds:.1f} s"
    if report.cost_from:
        compile_time += f" (+ {report.cost_compile_seconds:.1f} s traced and compiled for the cost)"
    table.add_row("compile", f"{compile_time}; peak host memory {_gib(report.peak_host_bytes)}")
    return table


def batch_words(report: SliceCompileReport) -> str:
    """The step's batch in words: tokens [A x B x S], or samples of named tensors (a diffusion step)."""
    batch = report.batch
    if isinstance(batch, NamedBatchShape):
        return (
            f"{batch.micro_batches} x {batch.batch} samples ({report.images_per_step:,} images, "
            f"{report.tokens_per_step:,} image tokens a step)"
        )
    return f"{batch.micro_batches} x {batch.batch} x {batch.seq_len} tokens ({report.tokens_per_step:,} a step)"


def throughput_words(report: SliceCompileReport) -> str:
    """Images (a diffusion step) or tokens a second a chip at the compiler's estimated step time."""
    if report.images_per_second_per_chip is not None:
        return f"{report.images_per_second_per_chip:,.2f} images/s a chip"
    return f"{report.tokens_per_second_per_chip:,.0f} tokens/s a chip"


def _gib(size: float) -> str:
    return f"{size / GiB:,.2f} GiB"
