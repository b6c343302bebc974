"""Compiling a step for a slice: a recipe's step as ``SliceProgram`` (what each kind of recipe builds), compiled by
libtpu for the slice's abstract devices with honest cost-model options, read into a ``SliceCompileReport``; and the
compiled program kept as a serialised executable."""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from titanpod.device import CHIPS, get_backend
from titanpod.device.memory import host_memory_stats
from titanpod.device.tpu_slices import TpuSlice, abstract_devices
from titanpod.graph import TrainConfig
from titanpod.graph.xla.ahead_of_time import (
    AbstractXlaStep,
    BatchShape,
    NamedBatchShape,
    device_mesh,
    serialized_executable,
)
from titanpod.graph.xla.program_figures import optimised_hlo, program_figures
from titanpod.runs.slice_report import SliceCompileReport

COST_MODEL_OPTIONS = {
    "xla_tpu_enable_windowed_einsum_for_all_gather": False,
    "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False,
    "xla_tpu_sliced_prefetch_max_slices": 0,
}
"""libtpu options that keep the cost analysis honest. The first two keep the compiler from turning gathers and
reductions next to matmuls into ``while`` loops, whose bodies count once. The third keeps it from copying a
buffer into VMEM in slices joined by a ``ConcatBitcast``, which libtpu 0.0.52's cost model prices at -1 s each
(on v6e a whole step's estimate came out negative); whole copies instead raise the estimate by 0.1% (Llama 3 8B
on v6e-256) to 5% (the debug model), and change nothing on v5p."""


@dataclass
class SliceProgram:
    """A recipe's training step ready to compile for a slice, and the figures its report sets beside the
    compiler's: what ``compile_program`` takes, built by each runner's kind of recipe (``compile_for_slice`` for
    the decoder LLMs, ``titanpod.runs.diffusion.slice_compile`` for FLUX)."""

    recipe: str
    """The recipe's name."""
    model: nn.Module
    """What the step trains (its ``loss`` is the step's loss), on the meta device: no weights."""
    plan: Any
    """The family's sharding plan (``titanpod.parallel.ShardingPlan``)."""
    train: TrainConfig
    """The step's settings as the pod runs them (``for_tpu``)."""
    axes: dict[str, int]
    """Mesh axis -> size over the slice's devices (every axis, size 1 too)."""
    gather_dtype: torch.dtype
    """The dtype FSDP gathers parameters in (``parallel.param_dtype``)."""
    batch: BatchShape | NamedBatchShape
    """The step's batch as the program takes it, over the whole mesh."""
    kernels: dict[str, str]
    """Slot -> kernel."""
    layers: int
    """Transformer blocks in the program."""
    model_layers: int
    """Transformer blocks of the recipe's model."""
    model_flops_per_chip: float
    """The model's training flops a step a chip (no recompute)."""
    tokens_per_step: int
    """Tokens one step trains on over the whole job."""
    planner_bytes: int
    """The dry-run planner's estimate of the step's memory a chip."""
    batch_text: str
    """The batch in words, for the table and the first line."""
    images_per_step: int = 0
    """Images one step trains on over the whole job (0 for a language model)."""


def compile_program(
    program: SliceProgram, tpu: TpuSlice, *, dump_dir: Path | None = None, say: Any = print
) -> tuple[SliceCompileReport, Any]:
    """Compile ``program``'s step for ``tpu`` with libtpu and report on it; also returns the ``jax.stages.Compiled``.

    ``dump_dir`` keeps the compiler's HLO there (a temporary folder otherwise, for the collectives).
    """
    chip = CHIPS[tpu.chip]
    devices = abstract_devices(tpu)
    split = {axis: size for axis, size in program.axes.items() if size > 1} or {"fsdp": 1}
    mesh = device_mesh(devices, split)
    say(
        f"compiling {program.recipe} ({program.layers} of {program.model_layers} layers) for {tpu.name}: mesh "
        + " x ".join(f"{axis} {size}" for axis, size in split.items())
        + f", batch {program.batch_text}"
    )
    backend = get_backend("xla")
    step = AbstractXlaStep(
        program.model, program.train, backend, program.plan, program.axes, mesh, program.gather_dtype
    )
    with tempfile.TemporaryDirectory(prefix="titanpod-hlo-") as scratch:
        folder = dump_dir or Path(scratch)
        compiled_step = step.compile(program.batch, folder, COST_MODEL_OPTIONS)
        figures = program_figures(compiled_step.compiled, optimised_hlo(compiled_step.compiled, folder))
    report = SliceCompileReport(
        recipe=program.recipe,
        slice=tpu.name,
        chips=tpu.total_chips,
        chip_hbm=chip.memory_bytes,
        chip_peak_flops=chip.peak_flops,
        mesh=split,
        batch=program.batch,
        layers=program.layers,
        model_layers=program.model_layers,
        kernels=program.kernels,
        program=figures,
        planner_bytes=program.planner_bytes,
        model_flops_per_chip=program.model_flops_per_chip,
        tokens_per_step=program.tokens_per_step,
        trace_seconds=compiled_step.trace_seconds,
        compile_seconds=compiled_step.compile_seconds,
        peak_host_bytes=host_memory_stats().peak_bytes or 0,
        scanned=step.layer_stack.stacks_any,
        images_per_step=program.images_per_step,
    )
    return report, compiled_step.compiled


def save_executable(compiled: Any, path: Path) -> Path | None:
    """The compiled program, serialised by JAX, to ``path``; ``None`` (with a note) where JAX cannot."""
    try:
        payload = serialized_executable(compiled)
    except Exception as error:
        print(f"the executable could not be serialised: {error}", file=sys.stderr)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path
