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

from titanpod.models.common.args import DecoderArgs
from titanpod.recipes.model_shape import ModelShape
from titanpod.recipes.recipe import Recipe

STEPS = 6
"""Optimizer steps of a rehearsal: three, a checkpoint, then three more after resuming."""
STOP_AT = 3
"""The step the interrupted run stops at, with its checkpoint."""
SEQ_LEN = 256
"""Tokens per sequence: two Splash tiles of 128 in each direction."""
SPLASH_BLOCK = 128
"""Splash tiles: the smallest the kernel takes (one TPU lane width)."""
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
VALIDATION_BATCHES = 2
"""Held-out batches per evaluation."""


PALLAS_CHOICES = ("splash", "pallas", "gmm")
"""Kernel choices that are Pallas kernels: interpret mode off a TPU."""


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


def small_shape(args: DecoderArgs, tp: int, ep: int) -> ModelShape:
    """The small model's sizes: same head ratio, head-width-to-model-width ratio and feed-forward ratios.

    Key/value heads divide over ``tp``; the experts keep the flavor's ``top_k`` and number
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
        n_layers=min(LAYERS, args.n_layers),
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
    """The lanes a rehearsal runs on this machine: the recipe's own where it is here, else the cpu and xla lanes.

    ``auto`` and ``tpu`` mean the tpu lane on a pod; here they rehearse as the torch executor
    on the cpu lane and the XLA SPMD executor on the xla lane, the two ways a pod step is built.
    """
    lane = recipe.device.lane
    if lane in ("auto", "tpu"):
        return ("cpu", "xla")
    if lane in ("cpu", "xla"):
        return (lane,)
    raise RehearsalError(
        f"device.lane {lane!r} cannot be rehearsed on this machine (it has no such device); "
        "rehearse with --device.lane auto (cpu and xla lanes) or run the recipe where that lane exists."
    )


def check_honourable(recipe: Recipe, lanes: tuple[str, ...]) -> None:
    """``RehearsalError`` naming the first setting this machine cannot run as the recipe sets it."""
    if recipe.train.memory_policy == "offload" and "xla" in lanes:
        raise RehearsalError(
            "train.memory_policy 'offload' moves activations to pinned host memory, which the xla lane's CPU "
            "devices do not have; rehearse it on the cpu lane only (--device.lane cpu)."
        )
    if recipe.data.source == "hub" and recipe.data.shuffle_buffer:
        raise RehearsalError(
            "data.shuffle_buffer is refilled on resume, so the rehearsal could not check that a resumed run "
            "equals an uninterrupted one; rehearse with --data.shuffle-buffer 0."
        )
    args = recipe.model.args()
    if recipe.parallel.tp > 1 and args.moe is not None:
        raise RehearsalError("parallel.tp with a mixture-of-experts model is not supported; split experts with ep.")


def _text(value: object) -> str:
    return "none" if value is None else str(value)


def scale_recipe(
    recipe: Recipe, lane: str, runs_dir: Path, data_dir: Path, tokenizer: Path
) -> tuple[Recipe, list[Setting]]:
    """``recipe`` at rehearsal scale on ``lane`` (``cpu``: torch executor, ``xla``: XLA SPMD), and the table rows.

    ``data_dir`` holds the local stand-in for a Hub dataset (same config name and splits) and
    ``tokenizer`` a ``tokenizer.json``; a recipe on local or built-in data keeps its own.
    """
    args = recipe.model.args()
    parallel = recipe.parallel
    shape = small_shape(args, scaled_degree(parallel.tp), scaled_degree(parallel.ep))
    rows: list[Setting] = []

    def row(name: str, old: object, new: object) -> None:
        rows.append(Setting(name, _text(old), _text(new)))

    row("model", f"{recipe.model.family} {recipe.model.flavor}", f"{recipe.model.family} {recipe.model.flavor}")
    for name, value in shape.changed().items():
        full = getattr(args.moe, name) if name in ("n_experts", "top_k", "expert_ffn_dim") else getattr(args, name)
        row(f"model.shape.{name}", full, value)
    for name in ("qk_norm", "tie_embeddings", "rope_theta", "norm_eps"):
        row(f"model.{name}", getattr(args, name), getattr(args, name))
    row("model.rope_scaling", args.rope_scaling is not None, args.rope_scaling is not None)
    if args.moe is not None:
        row("model.moe.norm_topk_prob", args.moe.norm_topk_prob, args.moe.norm_topk_prob)
        row("model.moe.aux_loss_coef", args.moe.aux_loss_coef, args.moe.aux_loss_coef)
    heads = f"{args.n_heads}/{args.n_kv_heads}"
    row("model.gqa (query/kv heads)", f"{heads} = {args.n_heads // args.n_kv_heads}",
        f"{shape.n_heads}/{shape.n_kv_heads} = {(shape.n_heads or 1) // (shape.n_kv_heads or 1)}")  # fmt: skip

    row("device.lane", recipe.device.lane, lane)
    scaled_parallel = dataclasses.replace(
        parallel,
        dp_replicate=scaled_degree(parallel.dp_replicate),
        fsdp=scaled_degree(parallel.fsdp),
        ep=scaled_degree(parallel.ep),
        tp=scaled_degree(parallel.tp),
    )
    devices = TORCH_PROCESSES if lane == "cpu" else XLA_DEVICES
    axes = scaled_parallel.mesh_axes(devices)
    executor = "torch executor, gloo processes" if lane == "cpu" else "XLA SPMD, host devices"
    for axis in ("dp_replicate", "fsdp", "ep", "tp"):
        old = getattr(parallel, axis)
        row(f"parallel.{axis}", "all the rest" if old == -1 else old, f"{axes[axis]} ({executor})")
    for name in ("sequence_parallel", "param_dtype", "reduce_dtype"):
        row(f"parallel.{name}", getattr(parallel, name), getattr(parallel, name))

    kernels = recipe.kernels
    splash = dataclasses.replace(
        kernels.splash,
        block_q=min(kernels.splash.block_q, SPLASH_BLOCK),
        block_kv=min(kernels.splash.block_kv, SPLASH_BLOCK),
    )
    scaled_kernels = dataclasses.replace(kernels, splash=splash)
    row(
        "kernels.attention",
        kernels.attention,
        kernels.attention + (" (Pallas interpret mode)" if kernels.attention == "splash" else ""),
    )
    row(
        "kernels.head_loss",
        kernels.head_loss,
        kernels.head_loss + (" (Pallas interpret mode)" if kernels.head_loss == "pallas" else ""),
    )
    if args.moe is not None:
        row("kernels.expert_matmul", kernels.expert_matmul,
            kernels.expert_matmul + (" (Pallas interpret mode)" if kernels.expert_matmul == "gmm" else ""))  # fmt: skip
    if kernels.attention == "splash":
        row("kernels.splash.block_q", kernels.splash.block_q, splash.block_q)
        row("kernels.splash.block_kv", kernels.splash.block_kv, splash.block_kv)
    row("kernels.window", kernels.window, kernels.window)

    data = recipe.data
    seq_len = min(data.seq_len, SEQ_LEN)
    new_data = dataclasses.replace(
        data,
        seq_len=seq_len,
        validation_batches=min(data.validation_batches, VALIDATION_BATCHES),
        validation_every=min(data.validation_every, STOP_AT) if data.validation_every else 0,
    )
    if data.source == "hub":
        new_data = dataclasses.replace(new_data, path=str(data_dir), tokenizer=str(tokenizer))
        row("data.source", "hub (streamed)", "hub (streamed)")
        row("data.path", data.path, f"{data_dir.name}/ (built-in corpus in the dataset's layout: no network here)")
        row("data.name / splits", f"{data.name} / {data.split}, {data.validation_split}",
            f"{data.name} / {data.split}, {data.validation_split}")  # fmt: skip
        row("data.tokenizer", data.tokenizer, "built-in tokenizer.json (the Hub's is not reachable here)")
    else:
        row("data.source", data.source, data.source)
    row("data.seq_len", data.seq_len, seq_len)
    row("data.batch_size (per data rank)", data.batch_size, data.batch_size)
    row("data.document_masking", data.document_masking, data.document_masking)
    row("data.validation_every", data.validation_every, new_data.validation_every)
    row("data.validation_batches", data.validation_batches, new_data.validation_batches)

    train = recipe.train
    warmup = max(1, min(train.warmup_steps, STOP_AT - 1))
    new_train = dataclasses.replace(train, steps=STEPS, warmup_steps=warmup, log_every=1, stop_at_step=0)
    row("train.steps", train.steps, f"{STEPS} (stop at {STOP_AT}, resume)")
    row("train.warmup_steps", train.warmup_steps, warmup)
    for name in ("step_mode", "memory_policy", "compiler", "precision", "lr", "decay", "min_lr_ratio",
                 "weight_decay", "grad_clip", "grad_accum_steps", "seed"):  # fmt: skip
        row(f"train.{name}", getattr(train, name), getattr(train, name))
    row("train.log_every", train.log_every, 1)

    checkpoint = recipe.checkpoint
    new_checkpoint = dataclasses.replace(checkpoint, every=STOP_AT, resume="auto")
    row("checkpoint.every", checkpoint.every, STOP_AT)
    for name in ("async_save", "keep_last", "at_end", "export_hf"):
        row(f"checkpoint.{name}", getattr(checkpoint, name), getattr(checkpoint, name))

    scaled = dataclasses.replace(
        recipe,
        model=dataclasses.replace(recipe.model, shape=shape),
        device=dataclasses.replace(recipe.device, lane=lane),
        parallel=scaled_parallel,
        kernels=scaled_kernels,
        data=new_data,
        train=new_train,
        checkpoint=new_checkpoint,
        output=dataclasses.replace(recipe.output, runs_dir=str(runs_dir), run_name=None),
    )
    return scaled, rows
