"""The dry-run planner: what a recipe costs per device on a given slice, without running it.

The model is built on the meta device. Parameters, gradients and optimizer state come
from the family's sharding plan on the mesh (each parameter's local share, fp32 masters,
fp32 gradients, two fp32 AdamW moments). Activations come from one block and the head
measured on meta tensors (``activations.py``) and the step's memory policy:

==========  ===========================================  ============================
policy      kept between forward and backward, per block  extra while running backward
==========  ===========================================  ============================
save        everything autograd saves                     -
selective   matmul and attention outputs, block input     the rest of one block
recompute   the block input                               one whole block
offload     nothing (block inputs go to the host)         one block and two inputs
==========  ===========================================  ============================

The backward's working memory is the larger of the head's saved bytes (its gradients, as
large, exist at the start of the backward) and the recomputed part of one block; when
parameters are sharded, two blocks of gathered parameters in the compute dtype (this block
and the prefetched next) come on top. A compiler may fuse and free sooner,
so the activation figures are an upper estimate for compiled steps.

With pipeline stages (``parallel.pp`` > 1) each device holds its pp rank's stages and the activations of
the micro-batches in flight under the schedule (``pipeline_memory.py``); the figure is the largest rank's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from titanpod.device import ChipSpec, backend_class
from titanpod.graph.xla.moment_pieces import largest_piece_numel
from titanpod.kernels import model_ops
from titanpod.models import DecoderArgs, Transformer, parameter_count
from titanpod.parallel import DATA_AXES, ShardingPlan
from titanpod.parallel.torch_executor import pipeline_layout
from titanpod.parallel.torch_executor.pipeline_stages import check_pipelinable
from titanpod.recipes.families import build_model, sharding_plan
from titanpod.recipes.layout_support import check_layout
from titanpod.recipes.pipeline_batch import with_pipeline_microbatches
from titanpod.recipes.planner.activations import SavedBytes, block_saved_bytes, head_saved_bytes
from titanpod.recipes.planner.compiled_step import (
    hidden_itemsize,
    kept_logits_bytes,
    weight_copy_bytes,
    widened_block,
)
from titanpod.recipes.planner.host import HostMemoryPlan, plan_host_memory, planned_lane
from titanpod.recipes.planner.lane_traits import runs_one_jitted_program
from titanpod.recipes.planner.limits import FIT_FRACTION
from titanpod.recipes.planner.pipeline_bubble import pipeline_bubble
from titanpod.recipes.planner.pipeline_memory import pipeline_memory
from titanpod.recipes.recipe import Recipe

__all__ = ["FIT_FRACTION", "MemoryPlan", "RunPlan", "plan_run", "with_changes"]

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
STREAMED_UPDATE_BYTES = 20
"""Device bytes an element of the piece being updated holds with ``train.optimizer_offload``: its two fp32 moments
brought in (8), their new values (8) and the new fp32 parameter (4). libtpu 0.0.52 compiling ``llama32_1b`` for a
v5litepod-1, when a tensor's moments came in whole, counted 10.20 GiB of temporaries: 4.60 of gradients and 5.6 for
the update of its largest tensor, an MLP matrix stacked over the 16 blocks (268M elements: 21 bytes each)."""


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes on one device, by what holds them."""

    parameters: int
    """This device's share of the fp32 parameters."""
    gradients: int
    """This device's share of the fp32 gradients."""
    optimizer: int
    """This device's share of the AdamW moments (two fp32 tensors per parameter)."""
    activations: int
    """Activations kept for the backward pass under the memory policy (one micro-batch)."""
    transient: int
    """Working memory at the peak: backward gradients, recomputed blocks, gathered parameters."""
    host_offload: int = 0
    """Bytes kept in host memory (not counted in ``total``): the ``offload`` policy's activations, and AdamW's
    moments with ``train.optimizer_offload``."""

    @property
    def total(self) -> int:
        """Predicted peak bytes on one device."""
        return self.parameters + self.gradients + self.optimizer + self.activations + self.transient


@dataclass(frozen=True)
class RunPlan:
    """Everything the dry run works out for one recipe on one slice."""

    recipe: str
    """Recipe name."""
    model: str
    """Family and flavor, e.g. ``llama3 405B``."""
    parameters: int
    """All parameters."""
    active_parameters: int
    """Parameters one token uses (differs from ``parameters`` for MoE)."""
    flops_per_token: float
    """Training FLOPs per token (6N + attention; see docs/training.md, Metrics and MFU)."""
    chip: ChipSpec
    """The device the plan is for."""
    chips: int
    """Chips in the slice."""
    devices: int
    """Devices in the slice (chips x devices per chip)."""
    mesh: dict[str, int]
    """Mesh axis -> size."""
    batch_per_device: int
    """Sequences in one micro-batch on each data-parallel rank."""
    seq_len: int
    """Tokens per sequence."""
    grad_accum_steps: int
    """Micro-batches per optimizer step."""
    tokens_per_step: int
    """Tokens in one optimizer step over the whole slice."""
    memory_policy: str
    """Activation memory policy the plan assumes."""
    precision: str
    """``fp32`` or ``bf16`` compute."""
    memory: MemoryPlan
    """Predicted bytes per device."""
    target_mfu: float
    """MFU the step time is worked out for."""
    host: HostMemoryPlan | None = None
    """Predicted host memory per process and per worker VM (``None`` on the cpu lane)."""
    pipeline: str = ""
    """With pp > 1, the schedule in words (e.g. ``1f1b, 8 micro-batches``); empty without."""
    pipeline_bubble: float = 0.0
    """With pp > 1, the fraction of a step each rank idles in the schedule's warm-up and drain (0 without)."""
    context_parallel_bytes: int = 0
    """Bytes each device receives per step for context parallelism: every layer's keys and values gathered
    from the other cp ranks going forward (again where the memory policy recomputes the block) and their
    gradients reduce-scattered going back; 0 without cp."""

    def chips_text(self) -> str:
        """The slice in words, e.g. ``512 x v5p`` or ``2 x v7 (4 devices)``."""
        text = f"{self.chips} x {self.chip.name}"
        return text + (f" ({self.devices} devices)" if self.devices != self.chips else "")

    @property
    def device_fits(self) -> bool:
        """Whether the predicted peak leaves the runtime its share of the device's memory."""
        return self.memory.total <= FIT_FRACTION * self.chip.memory_bytes

    @property
    def fits(self) -> bool:
        """Whether the device fits and the worker VM does too (where its memory is known)."""
        return self.device_fits and (self.host is None or self.host.fits is not False)

    @property
    def step_seconds(self) -> float:
        """Seconds per optimizer step at ``target_mfu`` while working, stretched by the pipeline's idle share."""
        working = self.flops_per_token * self.tokens_per_step / (self.devices * self.chip.peak_flops * self.target_mfu)
        return working / (1.0 - self.pipeline_bubble)

    @property
    def tokens_per_second_per_device(self) -> float:
        """Throughput per device at ``target_mfu``."""
        return self.tokens_per_step / self.step_seconds / self.devices


def plan_run(recipe: Recipe, chip: ChipSpec, chips: int, target_mfu: float, args: DecoderArgs | None = None) -> RunPlan:
    """Plan ``recipe`` on ``chips`` chips of kind ``chip``; ``PlanError`` if the mesh does not fit the model.
    ``args``: the model's shape when not the recipe flavor's (a run started from a checkpoint has the
    checkpoint's, ``titanpod.runs.init_from.model_args``)."""
    if chips < 1:
        raise ValueError(f"--chips must be at least 1, got {chips}.")
    if not 0 < target_mfu <= 1:
        raise ValueError(f"The target MFU must be in (0, 1], got {target_mfu}.")
    devices = chips * chip.devices_per_chip
    lane = planned_lane(recipe.device.lane, chip)
    check_layout("pretrain", lane, backend_class(lane), recipe.parallel, recipe.train)  # as the runner will
    recipe = with_pipeline_microbatches(recipe)  # with pp: the step's batch in the pipeline's micro-batches
    model = build_model(recipe.model.family, args or recipe.model.args(), model_ops(recipe.kernels))
    mesh = recipe.parallel.mesh_axes(devices)
    plan = sharding_plan(recipe.model.family)
    named = dict(model.named_parameters())
    plan.check(named, mesh)
    local = sum(plan.local_numel(name, tuple(p.shape), mesh) for name, p in named.items())
    train, data = recipe.train, recipe.data
    dtype = torch.bfloat16 if train.precision == "bf16" else torch.float32
    local_seq = data.seq_len // mesh["cp"]  # each cp rank runs its share of every row through the blocks
    jitted = runs_one_jitted_program(lane)
    # The jitted step keeps the hidden states between blocks whole over tp (titanpod.graph.xla's hidden_layout).
    sequence_parallel = recipe.parallel.sequence_parallel and not jitted
    sharded = mesh["fsdp"] * mesh["cp"] * mesh["ep"] > 1  # parameters are gathered a block at a time
    hidden = hidden_itemsize(dtype, recipe.parallel.param_dtype, sharded)  # see compiled_step.py
    block = widened_block(
        block_saved_bytes(model.args, data.batch_size, local_seq, dtype, mesh["tp"], sequence_parallel,
                          attention=model.ops.attention if recipe.kernels.attention == "math" else None),
        model.args, data.batch_size, local_seq, dtype, hidden,
        jitted=jitted, tp=mesh["tp"], sequence_parallel=sequence_parallel,
    )  # fmt: skip
    head = head_saved_bytes(model.args, data.batch_size, local_seq, dtype, model.ops.head_loss)
    logits = 0
    if recipe.kernels.head_loss == "pallas" and recipe.kernels.pallas_loss.keep_logits:
        logits = kept_logits_bytes(data.batch_size * local_seq, model.args.vocab_size, hidden)
    gathered = 0
    if sharded:  # this block's parameters and the prefetched next one's
        gathered = 2 * _gathered_block_numel(plan, model, mesh) * _BYTES[recipe.parallel.param_dtype]
    elif jitted and dtype == torch.bfloat16 and mesh["pp"] == 1:  # one program: no pipeline stages
        gathered = weight_copy_bytes(_local_block_numel(plan, model, mesh), model.args.n_layers)
    kv_bytes = _kv_bytes(model, data.batch_size, data.seq_len, dtype, mesh["tp"]) if mesh["cp"] > 1 else 0
    if jitted and mesh["ep"] > 1:
        gathered += _whole_vocab_gradient_bytes(model)
    if kv_bytes:  # attention keeps the gathered keys and values (whole rows) for backward, not just its own
        others = kv_bytes * (mesh["cp"] - 1) // mesh["cp"]
        block = dataclasses.replace(block, all_saved=block.all_saved + others, matmul_saved=block.matmul_saved + others)
    policy, pipeline, bubble = train.memory_policy, "", 0.0
    if mesh["pp"] > 1 and recipe.parallel.pp_recompute:
        policy = "recompute"  # the pipeline stages' own recompute (their steps run eager)
    if mesh["pp"] > 1:
        layout = pipeline_layout(recipe.parallel, train.grad_accum_steps)
        check_pipelinable(model, layout)

        def rank_memory(rank_local: int, kept_layers: int, holds_head: bool) -> MemoryPlan:
            return _memory(rank_local, block, head, kept_layers, policy, gathered + kv_bytes, holds_head, logits)

        memory = pipeline_memory(model, plan, mesh, layout, rank_memory)
        assert isinstance(memory, MemoryPlan)
        pipeline = f"{layout.schedule}, {layout.stages_per_rank} stage(s) a rank, {layout.microbatches} micro-batches"
        bubble = pipeline_bubble(layout)
    else:
        policy_name, layers = train.memory_policy, model.args.n_layers
        memory = _memory(local, block, head, layers, policy_name, gathered + kv_bytes, kept_logits=logits)
        if jitted and train.grad_accum_steps > 1:
            # One program sums the micro-batches' gradients: the running sum beside each micro-batch's own. libtpu
            # 0.0.52 compiling qwen3_06b for a v5litepod-1 with 2 micro-batches counted 1.84 GiB more temporaries
            # than with one (its gradients: 2.22 GiB). Summed inside the blocks' loop (train.sum_gradients_in_loop),
            # the stacked blocks' gradients have no second copy: Llama 3.2 1B at 2 and at 8 micro-batches compiled
            # to 13.62 GiB for a v5litepod-1, against 16.74 GiB of temporaries alone summed after each backward.
            second = memory.gradients
            if train.sum_gradients_in_loop and train.scan_layers:
                second -= model.args.n_layers * _local_block_numel(plan, model, mesh) * 4  # fp32, as stored
            memory = dataclasses.replace(memory, gradients=memory.gradients + max(0, second))
    if train.optimizer_offload:
        # The moments wait in host memory and come in one piece at a time for the update, after the backward
        # (titanpod.graph.xla.step_program.streamed_update), when the activations are gone: the largest piece's
        # two moments in, their new values and its new parameter rows out (STREAMED_UPDATE_BYTES an element).
        largest = _largest_update_numel(plan, model, mesh, stacked=train.scan_layers and jitted)
        in_flight = 2 if train.optimizer_offload_overlap else 1  # one piece coming in as the one before goes out
        streamed = STREAMED_UPDATE_BYTES * largest * in_flight
        memory = dataclasses.replace(
            memory,
            optimizer=0,
            transient=max(memory.transient, streamed - memory.activations),
            host_offload=memory.host_offload + memory.optimizer,
        )
    gathers = 2 if train.memory_policy in ("recompute", "offload") else 1  # a recomputed block gathers again
    cp_traffic = (gathers + 1) * model.args.n_layers * kv_bytes * (mesh["cp"] - 1) // mesh["cp"]
    data_ranks = math.prod(mesh[axis] for axis in DATA_AXES)
    host = plan_host_memory(
        {name: tuple(p.shape) for name, p in named.items()},
        plan,
        mesh,
        chip,
        chips,
        planned_lane(recipe.device.lane, chip),
        offload_per_device=memory.host_offload,
        async_checkpoint=recipe.checkpoint.async_save,
        final_save=recipe.output.save_weights or recipe.checkpoint.export_hf,
    )
    return RunPlan(
        recipe=recipe.name,
        model=f"{recipe.model.family} {recipe.model.flavor if args is None else 'from a checkpoint'}",
        parameters=parameter_count(model),
        active_parameters=model.active_parameter_count(),
        flops_per_token=model.flops_per_token(data.seq_len),
        chip=chip,
        chips=chips,
        devices=devices,
        mesh=mesh,
        batch_per_device=data.batch_size,
        seq_len=data.seq_len,
        grad_accum_steps=train.grad_accum_steps,
        tokens_per_step=data.batch_size * data.seq_len * data_ranks * train.grad_accum_steps,
        memory_policy=policy,
        precision=train.precision,
        memory=memory,
        target_mfu=target_mfu,
        host=host,
        pipeline=pipeline,
        pipeline_bubble=bubble,
        context_parallel_bytes=cp_traffic * train.grad_accum_steps,
    )


def _kv_bytes(model: Transformer, batch: int, seq_len: int, dtype: torch.dtype, tp: int) -> int:
    """Bytes of one layer's keys and values over whole rows, as context parallelism gathers them (this tp
    rank's heads)."""
    args = model.args
    kv_heads = max(1, args.n_kv_heads // tp)
    return 2 * batch * seq_len * kv_heads * args.resolved_head_dim * dtype.itemsize


def _whole_vocab_gradient_bytes(model: Transformer) -> int:
    """Bytes libtpu holds for the vocabulary tables' gradients on an ``ep`` mesh, whose tokens span ``ep`` while
    the tables are split over ``fsdp`` only: the embedding's gradient as a whole fp32 [vocab, dim] table and the
    head's as a whole bf16 one, reduced before they are split (Qwen3-235B-A22B on v5p-256, docs/recipes.md)."""
    whole = model.args.vocab_size * model.args.dim
    return 4 * whole + (0 if model.args.tie_embeddings else 2 * whole)


def _gathered_block_numel(plan: ShardingPlan, model: Transformer, mesh: dict[str, int]) -> int:
    """Elements of one block's parameters after the FSDP all-gather: tp and expert splits remain."""
    total = 0
    for name, param in model.layers[0].named_parameters():
        full = f"layers.0.{name}"
        tp_only = plan.local_numel(full, tuple(param.shape), {"tp": mesh["tp"]})
        total += tp_only // (mesh["ep"] if plan.rule_for(full).ep_dim is not None else 1)
    return total


def _local_block_numel(plan: ShardingPlan, model: Transformer, mesh: dict[str, int]) -> int:
    """Elements of one block's parameters held on this device (as stored: no gather)."""
    return sum(_local_block_numels(plan, model, mesh))


def _local_block_numels(plan: ShardingPlan, model: Transformer, mesh: dict[str, int]) -> list[int]:
    """Elements of each of one block's parameters held on this device (as stored: no gather)."""
    block = model.layers[0].named_parameters()
    return [plan.local_numel(f"layers.0.{name}", tuple(param.shape), mesh) for name, param in block]


def _largest_update_numel(plan: ShardingPlan, model: Transformer, mesh: dict[str, int], stacked: bool) -> int:
    """Elements on this device of the largest piece the optimizer updates with its moments in host memory: a
    parameter's, or with ``stacked`` (``train.scan_layers``) a block parameter's stacked over every block, as
    ``titanpod.graph.xla.moment_pieces`` splits them along their first axis."""
    layers, largest = model.args.n_layers, 0
    for name, param in model.named_parameters():
        if stacked and name.startswith("layers.") and not name.startswith("layers.0."):
            continue  # block 0's parameter stands for its stack
        shape, local = tuple(param.shape), plan.local_numel(name, tuple(param.shape), mesh)
        if stacked and name.startswith("layers.0."):  # [L, ...]: split by blocks, never over devices
            rows, local, split_first = layers, local * layers, False
        else:
            rows, split_first = (shape[0] if shape else 1), plan.splits(name, mesh).get(0, 1) > 1
        largest = max(largest, largest_piece_numel(rows, local, first_axis_split=split_first))
    return largest


def _memory(
    local_params: int,
    block: SavedBytes,
    head: SavedBytes,
    n_layers: int,
    policy: str,
    gathered: int,
    holds_head: bool = True,
    kept_logits: int = 0,
) -> MemoryPlan:
    """One device's bytes: ``n_layers`` blocks' kept activations, and the head's when ``holds_head``; the head's
    backward also holds ``kept_logits`` (the Pallas loss's logits, which have no gradient as large), before the
    blocks' backward starts."""
    host = 0
    head_saved = head.all_saved if holds_head else 0
    head_backward = 2 * head_saved + (kept_logits if holds_head else 0)  # its saved tensors, their gradients
    if policy == "save":
        kept, recomputed = block.all_saved, 0
    elif policy == "selective":
        kept, recomputed = block.matmul_saved + block.region_input, block.all_saved - block.matmul_saved
    elif policy == "recompute":
        kept, recomputed = block.region_input, block.recompute_bytes
    elif policy == "offload":
        kept, recomputed, host = 0, block.all_saved + 2 * block.region_input, n_layers * block.region_input
    else:
        raise ValueError(f"Unknown memory policy {policy!r}; choose save, selective, recompute or offload.")
    return MemoryPlan(
        parameters=4 * local_params,
        gradients=4 * local_params,
        optimizer=8 * local_params,
        activations=n_layers * kept + head_saved,
        transient=max(head_backward - head_saved, recomputed) + gathered,
        host_offload=host,
    )


def with_changes(recipe: Recipe, **sections: dict[str, object]) -> Recipe:
    """``recipe`` with fields of its sections replaced: ``with_changes(r, train={"memory_policy": "recompute"})``."""
    return dataclasses.replace(
        recipe, **{name: dataclasses.replace(getattr(recipe, name), **fields) for name, fields in sections.items()}
    )
