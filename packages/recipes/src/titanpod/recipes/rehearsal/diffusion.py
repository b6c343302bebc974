"""A FLUX pod recipe scaled to this machine: every setting kept, only the sizes made small.

The transformer keeps its double- and single-stream blocks (in the flavor's 1:2 ratio), its head width's split
over the rotary axes, MLP ratio, guidance embedding and the text widths' ratios to the model width; the
autoencoder and text encoders become tiny random models of the same architecture in a folder with the published
pipeline's layout; an image folder becomes a folder of drawn shapes with captions at a small resolution. The
parallel plan keeps its axes (scaled as for language models), and the run keeps its step mode, memory policy,
precision, optimizer, schedule shape, sampling and checkpointing for a few steps.

Every setting of the recipe is a row of the table. A setting this module does not know is refused by name
before anything runs, so a new field is never dropped silently: it is added to ``KEPT`` (run as written) or
scaled in ``scale_diffusion_recipe``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from titanpod.device import backend_class
from titanpod.graph import ProfileConfig
from titanpod.kernels import KernelConfig
from titanpod.models.flux import FluxArgs
from titanpod.parallel import FLUX_PLAN, ParallelConfig
from titanpod.recipes.diffusion.flux_shape import FluxShape
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.layout_support import layout_problem
from titanpod.recipes.rehearsal.scaling import NOTES as DECODER_NOTES
from titanpod.recipes.rehearsal.scaling import (
    REHEARSAL_LANES,
    STEPS,
    STOP_AT,
    RehearsalError,
    Setting,
    check_memory_policy,
    leaves,
    scale_kernels,
    scaled_degree,
    setting_row,
    text_of,
)

RESOLUTION = 64
"""Image side of the rehearsal (pixels): 8 x 8 latents, 16 image tokens over 4 rows and 4 columns."""
HEAD_DIM = 32
"""Width of one head of the small transformer: FLUX's rotary split of 16:56:56 out of 128 is 4:14:14 of it."""
HEADS = 2
"""Fewest attention heads of the small transformer (see ``small_heads``)."""
DOUBLE_BLOCKS = 1
"""Double-stream blocks of the small transformer; the single-stream blocks keep the flavor's ratio to them."""
WIDTH_STEP = 8
"""The small transformer's text widths are rounded up to a multiple of this where no exact ratio fits."""
SAMPLE_EVERY = STOP_AT
"""Steps between sample grids: the uninterrupted run draws one mid-run (step 3) and trains on, the stopped run
draws it before it stops and the resumed one only at the end, so equal resumed losses also show that drawing
samples does not disturb training."""
SAMPLE_STEPS = 4
"""Euler steps of a rehearsal's sample grids at most: the same sampler and schedule, fewer steps."""
SMALL_MODEL_LR = 3e-3
"""Peak learning rate of the small transformer, where the recipe's is lower: a rate sized for 12B parameters
moves a 1M-parameter model's loss less in 6 steps than the loss varies with the random timesteps, so the
rehearsal could not see it learn. The schedule (warmup, decay, floor) keeps the recipe's shape."""
PIPELINE_FOLDER = "FLUX.1-dev"
"""The rehearsal's tiny pipeline folder (autoencoder and text encoders), named like the published one."""
IMAGES_FOLDER = "images"
"""The rehearsal's image folder."""

KEPT = frozenset({
    "name", "device.chip",
    "model.flavor", "model.guidance", "model.recompute_blocks", "model.transformer_weights",
    "parallel.sequence_parallel", "parallel.param_dtype", "parallel.reduce_dtype", "parallel.fsdp_bucket_mb",
    "parallel.fsdp_prefetch", "parallel.pp_schedule", "parallel.pp_stages_per_rank", "parallel.pp_microbatches",
    "parallel.pp_recompute",
    "data.source", "data.name", "data.split", "data.image_field", "data.caption_field", "data.batch_size",
    "data.caption_dropout", "data.shapes_count", "data.validation_split", "data.validation_fraction",
    "train.decay", "train.min_lr_ratio", "train.weight_decay", "train.beta1", "train.beta2", "train.eps",
    "train.grad_clip", "train.seed", "train.step_mode", "train.memory_policy", "train.compiler",
    "train.step_compiler", "train.compile_cache_dir", "train.keep_host_memory", "train.scan_layers",
    "train.grad_accum_steps", "train.precision", "train.stop_at_step", "train.skip_nonfinite",
    "train.optimizer_offload", "train.optimizer_offload_overlap", "train.whole_step_update",
    "train.sum_gradients_in_loop",
    "checkpoint.at_end", "checkpoint.keep_last", "checkpoint.async_save", "checkpoint.resume",
    "checkpoint.export_hf", "checkpoint.allow_changes", "checkpoint.every_seconds", "checkpoint.notice_seconds",
    "checkpoint.watch_preemption",
    "samples.prompts", "samples.cfg_scale", "samples.cfg_stop", "samples.seed",
    "target.chip", "target.chips", "target.mfu",
})  # fmt: skip
"""Settings the rehearsal runs as the recipe writes them (``stop_at_step`` and ``resume`` are set per run;
``model.transformer_weights`` is refused unless unset)."""

PARALLEL_DEGREES = ("dp_replicate", "fsdp", "ep", "tp", "cp", "pp")
"""The parallel degrees: each becomes its mesh axis at rehearsal scale (``scaled_degree``)."""

SCALED = frozenset({
    *(f"parallel.{axis}" for axis in PARALLEL_DEGREES),
    "device.lane", "model.autoencoder", "model.text_encoders", "model.encodings_cache",
    "data.path", "data.resolution", "data.validation_batches",
    "train.steps", "train.lr", "train.warmup_steps", "train.log_every", "samples.steps",
    "checkpoint.every", "checkpoint.dir", "samples.every",
    "profile.steps", "profile.record_shapes", "profile.profile_memory", "profile.with_stack",
})  # fmt: skip
"""Settings ``scale_diffusion_recipe`` changes; the table shows their new values."""

GROUPS = ("model.shape.", "output.")
"""Settings handled as a group: the model's sizes (the model rows) and outputs (each run writes into the
rehearsal's folder)."""

NOTES = {
    "kernels.attention": DECODER_NOTES["kernels.attention"],
    "model.autoencoder": "a tiny random autoencoder of the same architecture in the pipeline layout (4 levels, "
    "16 latent channels, FLUX's latent scale and shift), read from its folder",
    "model.text_encoders": "tiny random CLIP and T5 (gated-GELU) with their tokenizers in the pipeline layout, "
    "read from the folder (T5 reads 512 tokens)",
    "model.encodings_cache": "each rehearsal's own encodings folder",
    "train.lr": f"{SMALL_MODEL_LR} (the small model's peak rate; the schedule keeps its shape)",
    "samples.every": f"{SAMPLE_EVERY} (grids at steps {SAMPLE_EVERY} and {STEPS}: mid-run, and at the stop and end)",
    "data.path": "a local folder of drawn shapes (PNG, twice the training side) with a metadata.jsonl of captions",
    "checkpoint.dir": "each rehearsal run's own checkpoints/ folder",
    "profile.steps": "None (a rehearsal traces nothing; W&B logging is off too)",
}
"""What a changed setting is shown as, where its new value (a local path) would not say it."""


@dataclass(frozen=True)
class DiffusionMaterials:
    """Where a FLUX rehearsal's local stand-ins are (written by ``titanpod.recipes.rehearsal.flux_materials``)."""

    images: Path
    """The image folder (``data.path``)."""
    pipeline: Path
    """The pipeline folder: ``vae/`` (``model.autoencoder``) and the text encoders (``model.text_encoders``)."""
    encodings: Path
    """The encodings cache folder, used when the recipe keeps one."""

    @classmethod
    def under(cls, folder: Path) -> DiffusionMaterials:
        """The stand-ins' places in a rehearsal's ``folder``."""
        return cls(folder / IMAGES_FOLDER, folder / PIPELINE_FOLDER, folder / "encodings")


def _round_up(value: float, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)


def small_heads(args: FluxArgs, tp: int) -> int:
    """Heads of the small transformer: the fewest, at least ``HEADS`` and a multiple of ``tp``, for which the
    flavor's text widths keep their exact ratios to the model width (FLUX.1's 4,096 / 3,072 needs a multiple of 3)."""
    for heads in range(HEADS, 8 * HEADS * tp + 1):
        dim = heads * HEAD_DIM
        if heads % tp == 0 and all(dim * width % args.dim == 0 for width in (args.context_dim, args.pooled_dim)):
            return heads
    return max(HEADS, tp)  # no exact fit: the widths are rounded up (see small_flux_shape)


def small_flux_shape(args: FluxArgs, tp: int) -> FluxShape:
    """The small transformer's sizes: ``small_heads`` heads of ``HEAD_DIM``, the rotary axes in the flavor's
    proportions, ``DOUBLE_BLOCKS`` double-stream blocks and single-stream blocks in the flavor's ratio, and text
    widths in the flavor's ratios to the model width."""
    heads = small_heads(args, tp)
    dim = heads * HEAD_DIM
    axes = [HEAD_DIM * width // args.head_dim for width in args.axes_dims]
    if sum(axes) != HEAD_DIM or any(width % 2 for width in axes):
        raise RehearsalError(
            f"model.axes_dims {tuple(args.axes_dims)} of a {args.head_dim}-wide head do not scale to whole even "
            f"widths of a {HEAD_DIM}-wide head; the FLUX rehearsal cannot keep their proportions."
        )
    depth = min(DOUBLE_BLOCKS, args.depth)
    single = max(1, round(depth * args.depth_single / args.depth)) if args.depth_single else 0
    return FluxShape(
        dim=dim,
        n_heads=heads,
        head_dim=HEAD_DIM,
        axes_dims=tuple(axes),
        depth=depth,
        depth_single=single,
        context_dim=_round_up(dim * args.context_dim / args.dim, WIDTH_STEP),
        pooled_dim=_round_up(dim * args.pooled_dim / args.dim, WIDTH_STEP),
    )


def _ratio(numerator: float, denominator: float) -> str:
    return str(Fraction(numerator / denominator).limit_denominator(64))


def _model_rows(args: FluxArgs, small: FluxArgs, shape: FluxShape) -> list[Setting]:
    """The transformer's sizes (flavor -> small) and the proportions and features the small one keeps."""
    rows = [
        Setting(f"model.{name}", text_of(getattr(args, name)), text_of(value))
        for name, value in shape.changed().items()
    ]
    features = {
        "model.double : single blocks": lambda a: f"1 : {_ratio(a.depth_single, a.depth)}",
        "model.axes_dims as parts of head_dim": lambda a: ", ".join(_ratio(w, a.head_dim) for w in a.axes_dims),
        "model.context_dim / dim": lambda a: _ratio(a.context_dim, a.dim),
        "model.pooled_dim / dim": lambda a: _ratio(a.pooled_dim, a.dim),
        "model.mlp_ratio": lambda a: a.mlp_ratio,
        "model.guidance_embed": lambda a: a.guidance_embed,
        "model.qkv_bias": lambda a: a.qkv_bias,
        "model.rope_theta": lambda a: a.rope_theta,
        "model.time_channels": lambda a: a.time_channels,
        "model.norm_eps": lambda a: a.norm_eps,
    }
    return rows + [Setting(name, text_of(read(args)), text_of(read(small))) for name, read in features.items()]


def _known(path: str, recipe: DiffusionRecipe) -> bool:
    """Whether the rehearsal knows how to run setting ``path`` (kernel choices: those of ``KernelConfig``)."""
    if path in KEPT or path in SCALED or path.startswith(GROUPS):
        return True
    return path.startswith("kernels.") and isinstance(getattr(recipe, "kernels", None), KernelConfig)


def check_known_settings(recipe: DiffusionRecipe) -> None:
    """``RehearsalError`` naming every setting of ``recipe`` the FLUX rehearsal does not know how to run."""
    unknown = [path for path in leaves(recipe.to_dict()) if not _known(path, recipe)]
    if unknown:
        which = "these settings" if len(unknown) > 1 else "this setting"
        raise RehearsalError(
            f"{', '.join(unknown)}: the FLUX rehearsal does not know {which}, so it could not show that the runs "
            "honour the recipe's values. Nothing was run. Rehearse without it, or teach "
            "titanpod.recipes.rehearsal.diffusion to keep it (KEPT) or scale it (scale_diffusion_recipe)."
        )


def check_diffusion_honourable(recipe: DiffusionRecipe, lanes: tuple[str, ...]) -> None:
    """``RehearsalError`` naming the first setting of ``recipe`` this machine cannot run on ``lanes``."""
    check_known_settings(recipe)
    check_memory_policy(recipe.train.memory_policy, lanes)
    if recipe.data.source == "hub":
        raise RehearsalError(
            f"data.source 'hub' ({recipe.data.path}): the FLUX rehearsal has no local stand-in for a Hub image "
            "dataset; rehearse the recipe with --data.source imagefolder --data.path FOLDER (any folder: the "
            "rehearsal draws its own images)."
        )
    if recipe.model.transformer_weights is not None:
        raise RehearsalError(
            f"model.transformer_weights {recipe.model.transformer_weights!r}: the rehearsal's small transformer "
            "cannot start from the published weights; rehearse without them (the runs start from train.seed)."
        )
    if recipe.parallel.tp > 1 and not any(rule.tp_dim is not None for rule in FLUX_PLAN.params):
        raise RehearsalError(
            f"parallel.tp={recipe.parallel.tp}: the FLUX sharding plan splits nothing over tp; shard with "
            "parallel.fsdp."
        )
    for lane in lanes:
        scaled = scale_parallel(recipe)
        problem = layout_problem("diffusion", lane, backend_class(lane), scaled, recipe.train)
        if problem is not None:
            raise RehearsalError(f"on the {lane} lane: {problem}")


def scale_parallel(recipe: DiffusionRecipe) -> ParallelConfig:
    """``recipe.parallel`` with every degree at rehearsal scale (see ``scaled_degree``)."""
    parallel = recipe.parallel
    degrees = {axis: scaled_degree(getattr(parallel, axis)) for axis in PARALLEL_DEGREES}
    return dataclasses.replace(parallel, **degrees)


def scale_diffusion_recipe(
    recipe: DiffusionRecipe, lane: str, runs_dir: Path, materials: DiffusionMaterials
) -> tuple[DiffusionRecipe, list[Setting]]:
    """``recipe`` at rehearsal scale on ``lane`` (``cpu``: torch executor, ``xla``: XLA SPMD), and the table rows.

    ``RehearsalError`` names a setting the rehearsal does not know. The autoencoder and text encoders are read
    from ``materials.pipeline``, the images from ``materials.images`` (a recipe on the built-in shapes keeps them).
    """
    check_known_settings(recipe)
    args = recipe.model.args()
    parallel = scale_parallel(recipe)
    shape = small_flux_shape(args, parallel.tp)
    model = dataclasses.replace(
        recipe.model,
        shape=shape,
        autoencoder=str(materials.pipeline / "vae") if recipe.model.autoencoder != "pixels" else "pixels",
        text_encoders=str(materials.pipeline) if recipe.model.text_encoders != "random" else "random",
        encodings_cache=str(materials.encodings) if recipe.model.encodings_cache else None,
    )
    data = dataclasses.replace(
        recipe.data,
        resolution=min(recipe.data.resolution, RESOLUTION),
        validation_batches=min(recipe.data.validation_batches, 1),
        path=str(materials.images) if recipe.data.source == "imagefolder" else recipe.data.path,
    )
    train = recipe.train
    changes: dict[str, Any] = {}
    if hasattr(recipe, "kernels"):  # kernel choices, where the recipe makes them
        changes["kernels"] = scale_kernels(recipe.kernels)  # type: ignore[attr-defined]
    scaled = dataclasses.replace(
        recipe,
        model=model,
        device=dataclasses.replace(recipe.device, lane=lane),
        parallel=parallel,
        data=data,
        train=dataclasses.replace(
            train,
            steps=STEPS,
            lr=max(train.lr, SMALL_MODEL_LR),
            warmup_steps=max(1, min(train.resolved_warmup_steps, STOP_AT - 1)),
            log_every=1,
            stop_at_step=0,
        ),
        checkpoint=dataclasses.replace(recipe.checkpoint, every=STOP_AT, resume="auto", dir=""),
        samples=dataclasses.replace(
            recipe.samples,
            every=SAMPLE_EVERY if recipe.samples.every else 0,
            steps=min(recipe.samples.steps, SAMPLE_STEPS),
        ),
        output=dataclasses.replace(recipe.output, runs_dir=str(runs_dir), run_name=None, wandb=None),
        profile=ProfileConfig(),  # the recipe's steps to trace are past the rehearsal's few
        **changes,
    )
    return scaled, diffusion_settings_rows(recipe, scaled, args, lane)


def diffusion_settings_rows(
    recipe: DiffusionRecipe, scaled: DiffusionRecipe, args: FluxArgs, lane: str
) -> list[Setting]:
    """Every setting of ``recipe`` beside its value in ``scaled`` (none left out), model sizes and proportions first."""
    executor = REHEARSAL_LANES[lane].executor
    axes = scaled.parallel.mesh_axes(REHEARSAL_LANES[lane].devices)
    rows = _model_rows(args, scaled.model.args(), scaled.model.shape)
    old, new = leaves(recipe.to_dict()), leaves(scaled.to_dict())
    for path, value in old.items():
        if path.startswith(GROUPS):
            continue  # the sizes are in the model rows; outputs go to the rehearsal's folder
        row = setting_row(path, value, new[path], axes, executor, NOTES)
        if path == "train.step_mode" and value != "whole_step" and backend_class(lane).single_controller:
            row = dataclasses.replace(row, rehearsal=f"{value} (the {lane} lane runs every step as one program)")
        rows.append(row)
    return rows
