"""``--compile-for SLICE``: a recipe's whole training step compiled by the TPU compiler for a slice, on any host.

The program is the xla lane's step (``titanpod.graph.xla.XlaStep``): the recipe's model
(built on the meta device, no weights), its family's sharding plan on the slice's mesh, its
kernels compiled for the TPU (Pallas through Mosaic, never interpret mode), memory policy,
precision, micro-batches and the AdamW update, all in one ``jax.jit`` program compiled by
libtpu for the slice's abstract devices (``titanpod.device.tpu_slices``). The report sets the
compiler's figures (memory a chip, flops, estimated step time) beside the dry-run planner's.

A recipe with ``train.scan_layers`` compiles its full depth with the blocks as one loop, quickly at any
depth; that compile gives the memory a chip. The compiler's cost analysis counts a loop's body once, so
its flops, bytes, estimated time and collectives come instead from compiles of shallow unrolled copies
(``COST_DEPTHS`` layers), extrapolated by depth (``with_costs_from``); the report names which compile gave
which figure (``SliceCompileReport.sources``).

Here a decoder LLM recipe becomes the program compiled (``llm_program``). Compiling a program is
``titanpod.runs.slice_program``'s, extrapolating by depth ``titanpod.runs.depth_extrapolation``'s and the
report ``titanpod.runs.slice_report``'s; their names are importable from here too.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from titanpod.device import CHIPS
from titanpod.device.tpu_slices import TpuSlice, parse_slice, slice_of
from titanpod.graph.xla.ahead_of_time import BatchShape
from titanpod.kernels import KernelConfig, model_ops
from titanpod.parallel import DATA_AXES
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.families import build_model, sharding_plan
from titanpod.recipes.planner.plan import plan_run
from titanpod.recipes.recipe import Recipe
from titanpod.runs.depth_extrapolation import COST_DEPTHS, extrapolated, with_costs_from
from titanpod.runs.slice_program import COST_MODEL_OPTIONS, SliceProgram, compile_program, save_executable
from titanpod.runs.slice_report import SliceCompileReport, write_report

__all__ = [
    "COST_DEPTHS",
    "COST_MODEL_OPTIONS",
    "SliceCompileReport",
    "SliceProgram",
    "compile_for_slice",
    "compile_program",
    "compiled_kernels",
    "extrapolated",
    "for_tpu",
    "llm_program",
    "save_executable",
    "target_slice",
    "with_costs_from",
    "write_report",
]


def target_slice(recipe: Recipe | DiffusionRecipe, name: str) -> TpuSlice:
    """The slice ``--compile-for`` names: ``target`` is the recipe's own (``target.chip`` x ``target.chips``)."""
    if name == "target":
        return slice_of(recipe.target.chip, recipe.target.chips)
    return parse_slice(name)


def for_tpu(recipe: Recipe, layers: int | None = None) -> Recipe:
    """The recipe as the pod runs it: its Pallas kernels compiled (never interpret mode), no step cache, and
    the model cut to ``layers`` transformer layers when given (then unrolled: those compiles are for the
    cost analysis, which counts a loop's body once)."""
    kernels = compiled_kernels(recipe.kernels)
    model = recipe.model
    if layers is not None:
        model = dataclasses.replace(model, shape=dataclasses.replace(model.shape, n_layers=layers))
    train = dataclasses.replace(recipe.train, compile_cache_dir="off")
    if layers is not None:
        train = dataclasses.replace(train, scan_layers=False)
    return dataclasses.replace(recipe, kernels=kernels, model=model, train=train)


def compiled_kernels(kernels: KernelConfig) -> KernelConfig:
    """``kernels`` with every Pallas kernel compiled by Mosaic for the TPU (interpret mode off)."""
    return dataclasses.replace(
        kernels,
        splash=dataclasses.replace(kernels.splash, interpret=False),
        grouped_matmul=dataclasses.replace(kernels.grouped_matmul, interpret=False),
        pallas_loss=dataclasses.replace(kernels.pallas_loss, interpret=False),
    )


def compile_for_slice(
    recipe: Recipe, tpu: TpuSlice, *, layers: int | None = None, dump_dir: Path | None = None, say: Any = print
) -> tuple[SliceCompileReport, Any]:
    """Compile ``recipe``'s step for ``tpu`` and report on it; also returns the ``jax.stages.Compiled``.

    ``layers`` compiles the model cut to that many layers (a quick look; the full depth is the default).
    ``dump_dir`` keeps the compiler's HLO there (a temporary folder otherwise, for the collectives).
    """
    return compile_program(llm_program(recipe, tpu, layers), tpu, dump_dir=dump_dir, say=say)


def llm_program(recipe: Recipe, tpu: TpuSlice, layers: int | None = None) -> SliceProgram:
    """A decoder LLM recipe's step as the pod runs it on ``tpu``, cut to ``layers`` layers when given."""
    if recipe.parallel.pp > 1:
        raise ValueError(
            f"{recipe.name} runs pipeline stages (parallel.pp={recipe.parallel.pp}), which run as eager steps, "
            "not as one compiled program; --compile-for compiles the whole step of a recipe without pipelining."
        )
    chip = CHIPS[tpu.chip]
    full_depth = recipe.model.args().n_layers
    pod = for_tpu(recipe, layers)
    axes = pod.parallel.mesh_axes(tpu.total_chips * chip.devices_per_chip)
    data_ranks = math.prod(axes[axis] for axis in DATA_AXES)
    shape = BatchShape(
        micro_batches=pod.train.grad_accum_steps,
        batch=pod.data.batch_size * data_ranks,
        seq_len=pod.data.seq_len,
        documents=pod.data.document_masking,
    )
    model = build_model(pod.model.family, pod.model.args(), model_ops(pod.kernels))
    tokens = shape.micro_batches * shape.batch * shape.seq_len
    on_xla = dataclasses.replace(pod, device=dataclasses.replace(pod.device, lane="xla"))  # the step compiled here
    planned = plan_run(on_xla, chip, tpu.total_chips, pod.target.mfu)
    return SliceProgram(
        recipe=recipe.name,
        model=model,
        plan=sharding_plan(pod.model.family),
        train=pod.train,
        axes=axes,
        gather_dtype=getattr(torch, pod.parallel.param_dtype),  # as the pretraining runner builds the step
        batch=shape,
        kernels={slot: getattr(pod.kernels, slot) for slot in ("attention", "head_loss", "expert_matmul")},
        layers=model.args.n_layers,
        model_layers=full_depth,
        model_flops_per_chip=model.flops_per_token(shape.seq_len) * tokens / math.prod(axes.values()),
        tokens_per_step=tokens,
        planner_bytes=planned.memory.total,
        batch_text=f"{shape.micro_batches} x {shape.batch} x {shape.seq_len}",
    )
