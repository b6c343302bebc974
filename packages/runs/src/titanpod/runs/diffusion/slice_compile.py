"""``titanpod-diffusion --compile-for SLICE``: a FLUX recipe's whole training step compiled by libtpu for a slice.

The program is the xla lane's step over the flow-matching objective (``FlowMatchingModel``) of the recipe's
transformer, built on the meta device with the ops its run uses (``meta_transformer``), sharded by the FLUX
plan on the slice's mesh, with the recipe's memory policy, precision, micro-batches and AdamW update. The
frozen autoencoder and text encoders are not part of the step: it takes latents, noise, timesteps and text
encodings as inputs (``flow_matching_batch_shape``), as a run's step does. Compiling and reporting are the
language models' own (``titanpod.runs.slice_program``).

A copy cut to fewer blocks keeps FLUX's proportion of single-stream to double-stream blocks (``cut_args``),
so figures extrapolated by depth from two such copies grow as the whole model's do.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from titanpod.device import CHIPS
from titanpod.device.tpu_slices import TpuSlice
from titanpod.models.choice import choose
from titanpod.models.flux import FLUX_FLAVORS, FluxArgs
from titanpod.models.flux.flow_matching import FlowMatchingModel
from titanpod.parallel import DATA_AXES
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.families import sharding_plan
from titanpod.recipes.planner.flux import flux_attention_kernel, flux_sample_shape, plan_flux
from titanpod.runs.diffusion.batches import flow_matching_batch_shape
from titanpod.runs.diffusion.components import meta_transformer, transformer_args
from titanpod.runs.slice_compile import compiled_kernels
from titanpod.runs.slice_program import SliceProgram, compile_program
from titanpod.runs.slice_report import SliceCompileReport

FLUX_FAMILY = "flux"
"""The family whose sharding plan lays out the transformer."""


def block_unit(args: FluxArgs) -> int:
    """Blocks in the smallest copy that keeps FLUX's proportion: one double-stream block and its share of
    single-stream ones (3 for FLUX.1: 19 double, 38 single). ``ValueError`` when the single-stream count is not
    a whole multiple of the double-stream count, as no such copy exists."""
    if args.depth < 1 or args.depth_single % args.depth:
        raise ValueError(
            f"A FLUX copy cut by depth keeps the model's {args.depth_single} single-stream blocks a multiple of its "
            f"{args.depth} double-stream ones, and these are not; compile the full depth (drop --compile-layers)."
        )
    return 1 + args.depth_single // args.depth


def cut_args(args: FluxArgs, blocks: int | None) -> FluxArgs:
    """``args`` cut to ``blocks`` blocks in FLUX's proportion (``None``: uncut). ``ValueError`` naming
    ``--compile-layers`` when ``blocks`` is not a multiple of ``block_unit``. A copy may be deeper than the model
    (figures grow linearly with depth either way: a tiny model's costs are fitted from copies of 2 and 4 blocks)."""
    if blocks is None:
        return args
    unit = block_unit(args)
    if blocks < unit or blocks % unit:
        raise ValueError(
            f"--compile-layers {blocks}: a FLUX copy keeps one double-stream block to every "
            f"{unit - 1} single-stream ones, so it takes a multiple of {unit} blocks "
            f"(e.g. --compile-layers {unit} {2 * unit})."
        )
    doubles = blocks // unit
    return dataclasses.replace(args, depth=doubles, depth_single=doubles * (unit - 1))


def for_tpu_diffusion(recipe: DiffusionRecipe, cut: bool = False) -> DiffusionRecipe:
    """The recipe as a pod's xla lane runs it: no step cache (the compile is timed), lane ``xla``, Splash compiled
    by Mosaic, never interpreted; a ``cut`` copy's blocks unrolled (those compiles are
    for the cost analysis, which counts a loop's body once)."""
    train = dataclasses.replace(recipe.train, compile_cache_dir="off")
    if cut:
        train = dataclasses.replace(train, scan_layers=False)
    device = dataclasses.replace(recipe.device, lane="xla")
    return dataclasses.replace(recipe, train=train, device=device, kernels=compiled_kernels(recipe.kernels))


def diffusion_program(recipe: DiffusionRecipe, tpu: TpuSlice, layers: int | None = None) -> SliceProgram:
    """The FLUX recipe's step on ``tpu``, its transformer cut to ``layers`` blocks when given."""
    pod = for_tpu_diffusion(recipe, cut=layers is not None)
    chip = CHIPS[tpu.chip]
    sample = flux_sample_shape(pod)
    full = transformer_args(pod, sample.latent_channels)
    args = cut_args(full, layers)
    axes = pod.parallel.mesh_axes(tpu.total_chips * chip.devices_per_chip)
    data_ranks = math.prod(axes[axis] for axis in DATA_AXES)
    micro_batches = pod.train.grad_accum_steps
    batch = flow_matching_batch_shape(
        pod.data.batch_size * data_ranks, args, sample.image_tokens, sample.text_tokens, micro_batches
    )
    transformer = meta_transformer(pod, args)
    images = micro_batches * batch.batch
    planned = plan_flux(pod, chip, tpu.total_chips, pod.target.mfu, args)
    flops = transformer.flops_per_sample(sample.image_tokens, sample.text_tokens) * images
    return SliceProgram(
        recipe=recipe.name,
        model=FlowMatchingModel(transformer),
        plan=sharding_plan(FLUX_FAMILY),
        train=pod.train,
        axes=axes,
        gather_dtype=getattr(torch, pod.parallel.param_dtype),  # as the diffusion runner builds the step
        batch=batch,
        kernels={"attention": flux_attention_kernel(pod)},
        layers=args.depth + args.depth_single,
        model_layers=full.depth + full.depth_single,
        model_flops_per_chip=flops / math.prod(axes.values()),
        tokens_per_step=images * sample.image_tokens,
        planner_bytes=planned.memory.total,  # the step's own: the frozen encoders are not in it
        batch_text=f"{micro_batches} x {batch.batch} images of {sample.image_tokens} + {sample.text_tokens} tokens",
        images_per_step=images,
    )


def compile_diffusion_for_slice(
    recipe: DiffusionRecipe,
    tpu: TpuSlice,
    *,
    layers: int | None = None,
    dump_dir: Path | None = None,
    say: Any = print,
) -> tuple[SliceCompileReport, Any]:
    """Compile ``recipe``'s step for ``tpu`` and report on it (``compile_for_command``'s ``compile_one``)."""
    return compile_program(diffusion_program(recipe, tpu, layers), tpu, dump_dir=dump_dir, say=say)


def cost_depths(recipe: DiffusionRecipe) -> tuple[int, int]:
    """The block counts of the two unrolled copies whose costs a scanned compile of ``recipe`` takes: one and two
    units of FLUX's proportion (3 and 6 blocks for FLUX.1)."""
    unit = block_unit(choose("FLUX flavor", recipe.model.flavor, FLUX_FLAVORS))
    return unit, 2 * unit
