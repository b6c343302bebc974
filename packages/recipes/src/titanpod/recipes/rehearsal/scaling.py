"""A pod recipe scaled to this machine: every setting kept, only the sizes made small.

The model keeps its family's arithmetic (GQA ratio, explicit head width, q/k norms, tied or
untied head, RoPE and its scaling, MoE top-k and its routing rules) at a few million
parameters; the parallel plan keeps its axes with the degrees scaled to the processes (torch
executor) or host devices (xla executor) a rehearsal has; the run keeps its step mode, memory
policy, precision, kernels, optimizer, schedule shape, checkpointing and data pipeline, for a
few steps. ``scale_recipe`` says what it changed, setting by setting, so nothing is dropped
without a line in the table.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titanpod.device import backend_class
from titanpod.graph import ProfileConfig
from titanpod.kernels import KernelConfig
from titanpod.models.common.args import DecoderArgs
from titanpod.recipes.model_shape import EXPERT_SIZES, ModelShape
from titanpod.recipes.recipe import Recipe

STEPS = 6
"""Optimizer steps of a rehearsal: three, a checkpoint, then three more after resuming."""
STOP_AT = 3
"""The step the interrupted run stops at, with its checkpoint."""
SEQ_LEN = 256
"""Tokens per sequence: two Splash tiles of 128 in each direction."""
SPLASH_BLOCK = 128
"""Splash tiles: the smallest the kernel takes (one TPU lane width)."""
GMM_TILE = 128
"""gmm's tiles at most (rows, input and output widths): the small model's expert buffers are a few rows."""
VOCAB = 2048
"""Vocabulary of the small model (the built-in tokenizer has 1,152 tokens)."""
LAYERS = 2
"""Transformer blocks of the small model: enough for per-block memory policies to cut between blocks."""
HEAD_DIM = 16
"""Width of one attention head in the small model."""
TORCH_PROCESSES = 4
"""Processes (gloo, on this machine's CPU) the torch executor rehearses on."""
XLA_DEVICES = 8
"""Host devices the xla executor rehearses on."""
SPLIT_DEGREE = 2
"""Degree every parallel axis other than fsdp is scaled to (fsdp takes what is left)."""
VALIDATION_BATCHES = 1
"""Held-out batches per evaluation: the local validation split holds one batch of the largest pod batch
(qwen3_32b: 4 per data rank x 8 xla devices x 256 tokens)."""


@dataclass(frozen=True)
class RehearsalLane:
    """How one lane is rehearsed on this machine: the processes started and the devices each drives."""

    executor: str
    """The executor in words, as the rehearsal table shows it."""
    processes: int
    """Processes of one run (torch.distributed.run starts them when there are several)."""
    host_devices: int
    """Devices each process drives: XLA host devices of one controller when more than one."""
    pinned_host_memory: bool
    """The devices have pinned host memory to offload activations to (the ``offload`` memory policy)."""

    @property
    def devices(self) -> int:
        """Devices of the whole run, over which the parallel degrees are scaled."""
        return self.processes * self.host_devices


REHEARSAL_LANES = {
    "cpu": RehearsalLane(
        "torch executor, gloo processes", processes=TORCH_PROCESSES, host_devices=1, pinned_host_memory=True
    ),
    "xla": RehearsalLane("XLA SPMD, host devices", processes=1, host_devices=XLA_DEVICES, pinned_host_memory=False),
}
"""The lanes a rehearsal can run on this machine, and how each is run."""

POD_LANE = "tpu"
"""The lane ``device.lane auto`` means for a pod recipe, which the rehearsal stands in for."""


PALLAS_CHOICES = ("splash", "pallas", "gmm")
"""Kernel choices that are Pallas kernels: interpret mode off a TPU."""

TPU_ONLY_ATTENTION = {"splash_sdpa": "splash"}
"""Attention kernels only torch_tpu runs, and the same kernel through JAX that a rehearsal runs instead."""


class RehearsalError(ValueError):
    """A recipe setting the rehearsal cannot honour on this machine; the message names it."""


@dataclass(frozen=True)
class Setting:
    """One line of the rehearsal table."""

    name: str
    """The recipe field, e.g. ``parallel.tp``."""
    recipe: str
    """Its value in the recipe."""
    rehearsal: str
    """The value the rehearsal runs with (the same when kept)."""

    @property
    def kept(self) -> bool:
        """Whether the rehearsal runs the recipe's own value."""
        return self.recipe == self.rehearsal


def _round_up(value: float, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)


def small_shape(args: DecoderArgs, tp: int, ep: int, pipeline_stages: int = 1) -> ModelShape:
    """The small model's sizes: same head ratio, head-width-to-model-width ratio and feed-forward ratios.

    Key/value heads divide over ``tp``; the layers are ``LAYERS``, or one for each of the ``pipeline_stages``
    when there are more; the experts keep the flavor's ``top_k`` and number
    twice that, rounded up to a multiple of ``ep`` (so every ep rank holds whole experts).
    """
    ratio = args.n_heads // args.n_kv_heads
    kv_heads = max(2, tp)
    heads = ratio * kv_heads
    # Qwen 3 sets the head width apart from dim / n_heads (32B: 64 heads of 128 in a width of 5,120): keep that.
    width_per_head = args.dim / (args.n_heads * args.resolved_head_dim)
    dim = _round_up(heads * HEAD_DIM * width_per_head, 16)
    ffn = _round_up(dim * args.ffn_dim / args.dim, 16)
    shape = ModelShape(
        dim=dim,
        n_layers=max(min(LAYERS, args.n_layers), pipeline_stages),
        n_heads=heads,
        n_kv_heads=kv_heads,
        head_dim=HEAD_DIM if args.head_dim is not None else None,
        ffn_dim=ffn,
        vocab_size=min(VOCAB, args.vocab_size),
    )
    if args.moe is None:
        return shape
    experts = _round_up(2 * args.moe.top_k, max(ep, 2))
    expert_ffn = _round_up(dim * args.moe.expert_ffn_dim / args.dim, 16)
    return dataclasses.replace(shape, n_experts=experts, top_k=args.moe.top_k, expert_ffn_dim=expert_ffn)


def scaled_degree(degree: int) -> int:
    """A parallel degree at rehearsal scale: 1 stays 1, -1 (fsdp: what is left) stays -1, any split becomes 2."""
    return degree if degree in (1, -1) else SPLIT_DEGREE


def rehearsal_lanes(recipe: Recipe) -> tuple[str, ...]:
    """The lanes a rehearsal runs on this machine: the stand-ins its backend class names (``stand_in_lanes``:
    the cpu or xla lane itself; for the tpu lane, the cpu and xla lanes), keeping only those that build
    pipeline stages where the recipe has them and there is a choice.

    ``auto`` means the tpu lane on a pod; here it rehearses as the torch executor on the cpu lane and the
    XLA SPMD executor on the xla lane, the two ways a pod step is built.
    """
    lane = {"auto": POD_LANE}.get(recipe.device.lane, recipe.device.lane)
    lanes = tuple(name for name in backend_class(lane).stand_in_lanes if name in REHEARSAL_LANES)
    if recipe.parallel.pp > 1 and len(lanes) > 1:
        lanes = tuple(name for name in lanes if backend_class(name).supports_pipeline)
    if lanes:
        return lanes
    raise RehearsalError(
        f"device.lane {lane!r} cannot be rehearsed on this machine (it has no such device); "
        "rehearse with --device.lane auto (cpu and xla lanes) or run the recipe where that lane exists."
    )


def check_memory_policy(memory_policy: str, lanes: tuple[str, ...]) -> None:
    """``RehearsalError`` naming ``train.memory_policy`` when it needs what one of ``lanes`` lacks here."""
    if memory_policy == "offload" and not all(REHEARSAL_LANES[name].pinned_host_memory for name in lanes):
        raise RehearsalError(
            "train.memory_policy 'offload' moves activations to pinned host memory, which the xla lane's CPU "
            "devices do not have; rehearse it on the cpu lane only (--device.lane cpu)."
        )


def check_honourable(recipe: Recipe, lanes: tuple[str, ...]) -> None:
    """``RehearsalError`` naming the first setting this machine cannot run as the recipe sets it."""
    check_memory_policy(recipe.train.memory_policy, lanes)
    if recipe.data.source == "hub" and recipe.data.shuffle_buffer:
        raise RehearsalError(
            "data.shuffle_buffer is refilled on resume, so the rehearsal could not check that a resumed run "
            "equals an uninterrupted one; rehearse with --data.shuffle-buffer 0."
        )
    if recipe.parallel.pp > 1 and not all(backend_class(name).supports_pipeline for name in lanes):
        raise RehearsalError(
            f"parallel.pp={recipe.parallel.pp}: pipeline stages run with the torch executor only, not on the xla "
            "lane; rehearse on the cpu lane (--rehearse-lanes cpu, or --device.lane auto)."
        )
    args = recipe.model.args()
    if recipe.parallel.tp > 1 and args.moe is not None:
        raise RehearsalError("parallel.tp with a mixture-of-experts model is not supported; split experts with ep.")


def text_of(value: object) -> str:
    """A setting's value as the table shows it (``none`` for ``None``)."""
    return "none" if value is None else str(value)


def leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every setting of a recipe's ``to_dict`` by dotted path (``train.lr``)."""
    found: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(leaves(value, f"{path}."))
        else:
            found[path] = value
    return found


def _model_rows(args: DecoderArgs, shape: ModelShape) -> list[Setting]:
    """The model's sizes (flavor -> small) and the family features the small model keeps."""
    small = shape.apply(args)
    rows = []
    for name in shape.changed():
        expert = name in EXPERT_SIZES
        full = getattr(args.moe, name) if expert else getattr(args, name)
        rows.append(
            Setting(
                f"model.{'moe.' if expert else ''}{name}",
                text_of(full),
                text_of(getattr(small.moe if expert else small, name)),
            )
        )
    features = {
        "model.gqa (query heads per kv head)": lambda a: a.n_heads // a.n_kv_heads,
        "model.head_dim set apart from dim / n_heads": lambda a: (
            a.head_dim is not None and a.head_dim * a.n_heads != a.dim
        ),
        "model.qk_norm": lambda a: a.qk_norm,
        "model.tie_embeddings": lambda a: a.tie_embeddings,
        "model.rope_theta": lambda a: a.rope_theta,
        "model.rope_scaling": lambda a: (
            a.rope_scaling
            and f"factor {a.rope_scaling.factor}, original context {a.rope_scaling.original_max_position_embeddings}"
        ),
        "model.norm_eps": lambda a: a.norm_eps,
    }
    if args.moe is not None:
        features.update({
            "model.moe.norm_topk_prob": lambda a: a.moe.norm_topk_prob,
            "model.moe.aux_loss_coef": lambda a: a.moe.aux_loss_coef,
            "model.moe.capacity_factor": lambda a: getattr(a.moe, "capacity_factor", None),
        })  # fmt: skip
    rows += [Setting(name, text_of(read(args)), text_of(read(small))) for name, read in features.items()]
    return rows


NOTES = {
    "kernels.attention": "splash (torch_tpu's splash_sdpa runs on a TPU only; the same kernel through JAX)",
    "data.path": "a local folder: the built-in corpus in the dataset's layout, same config and splits",
    "data.tokenizer": "the built-in tokenizer (the Hub's is not reachable here)",
    "checkpoint.dir": "each rehearsal run's own checkpoints/ folder",
    "profile.steps": "None (a rehearsal traces nothing; W&B logging is off too)",
}
"""What a changed setting is shown as, where its new value (a local path) would not say it."""


def settings_rows(recipe: Recipe, scaled: Recipe, args: DecoderArgs, lane: str) -> list[Setting]:
    """Every setting of ``recipe`` beside its value in ``scaled`` (none left out), model sizes and features first."""
    executor = REHEARSAL_LANES[lane].executor
    axes = scaled.parallel.mesh_axes(REHEARSAL_LANES[lane].devices)
    rows = _model_rows(args, scaled.model.shape)
    old, new = leaves(recipe.to_dict()), leaves(scaled.to_dict())
    for path, value in old.items():
        if path.startswith("model.shape.") or path.startswith("output."):
            continue  # the sizes are in the model rows; outputs go to the rehearsal's folder
        rows.append(setting_row(path, value, new[path], axes, executor, NOTES))
    return rows


def setting_row(
    path: str, value: object, new: object, axes: dict[str, int], executor: str, notes: dict[str, str]
) -> Setting:
    """The table row of setting ``path``: ``value`` in the recipe, ``new`` in the rehearsal. A parallel degree
    shows the mesh axis size it ran with on ``executor``, a Pallas kernel says it ran in interpret mode, and a
    changed setting in ``notes`` shows its note."""
    rehearsal = text_of(new)
    axis = path.removeprefix("parallel.")
    if axis in axes:
        rehearsal = f"{axes[axis]} ({executor})"
        value = "all the rest" if value == -1 else value
    elif path.startswith("kernels.") and new in PALLAS_CHOICES:
        rehearsal += " (Pallas interpret mode)"
    if path in notes and new != value:
        rehearsal = notes[path]
    if path == "train.steps":
        rehearsal += f" (stop at {STOP_AT} with a checkpoint, resume)"
    return Setting(path, text_of(value), rehearsal)


def scale_kernels(kernels: KernelConfig) -> KernelConfig:
    """The kernel choices at rehearsal scale: the same kernels (a TPU-only attention as the same kernel through
    JAX), with Splash and gmm tiles no larger than the small model's sequences and expert buffers."""
    splash = dataclasses.replace(
        kernels.splash,
        block_q=min(kernels.splash.block_q, SPLASH_BLOCK),
        block_kv=min(kernels.splash.block_kv, SPLASH_BLOCK),
    )
    grouped = kernels.grouped_matmul
    tiles = dataclasses.replace(
        grouped,
        tile_rows=min(grouped.tile_rows, GMM_TILE),
        tile_in=min(grouped.tile_in, GMM_TILE),
        tile_out=min(grouped.tile_out, GMM_TILE),
    )
    attention = TPU_ONLY_ATTENTION.get(kernels.attention, kernels.attention)
    return dataclasses.replace(kernels, splash=splash, grouped_matmul=tiles, attention=attention)


def scale_recipe(
    recipe: Recipe, lane: str, runs_dir: Path, data_dir: Path, tokenizer: Path
) -> tuple[Recipe, list[Setting]]:
    """``recipe`` at rehearsal scale on ``lane`` (``cpu``: torch executor, ``xla``: XLA SPMD), and the table rows.

    ``data_dir`` holds the local stand-in for a Hub dataset (same config name and splits) and
    ``tokenizer`` a ``tokenizer.json``; a recipe on local or built-in data keeps its own.
    """
    args = recipe.model.args()
    parallel = recipe.parallel
    pp = scaled_degree(parallel.pp)
    stages = pp * (parallel.pp_stages_per_rank or (2 if parallel.pp_schedule == "interleaved_1f1b" else 1))
    shape = small_shape(args, scaled_degree(parallel.tp), scaled_degree(parallel.ep), stages if pp > 1 else 1)
    data = recipe.data
    new_data = dataclasses.replace(
        data,
        seq_len=min(data.seq_len, SEQ_LEN),
        validation_batches=min(data.validation_batches, VALIDATION_BATCHES),
        validation_every=min(data.validation_every, STOP_AT) if data.validation_every else 0,
    )
    if data.source == "hub":
        new_data = dataclasses.replace(new_data, path=str(data_dir), tokenizer=str(tokenizer))
    train = recipe.train
    scaled = dataclasses.replace(
        recipe,
        model=dataclasses.replace(recipe.model, shape=shape),
        device=dataclasses.replace(recipe.device, lane=lane),
        parallel=dataclasses.replace(
            parallel,
            dp_replicate=scaled_degree(parallel.dp_replicate),
            fsdp=scaled_degree(parallel.fsdp),
            ep=scaled_degree(parallel.ep),
            tp=scaled_degree(parallel.tp),
            pp=pp,
        ),
        kernels=scale_kernels(recipe.kernels),
        data=new_data,
        train=dataclasses.replace(
            train,
            steps=STEPS,
            warmup_steps=max(1, min(train.resolved_warmup_steps, STOP_AT - 1)),
            log_every=1,
            stop_at_step=0,
        ),
        checkpoint=dataclasses.replace(recipe.checkpoint, every=STOP_AT, resume="auto", dir=""),
        output=dataclasses.replace(recipe.output, runs_dir=str(runs_dir), run_name=None, wandb=None),
        profile=ProfileConfig(),  # the recipe's steps to trace are past the rehearsal's few
    )
    return scaled, settings_rows(recipe, scaled, args, lane)
