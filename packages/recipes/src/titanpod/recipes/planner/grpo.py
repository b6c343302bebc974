"""The dry-run plan of a GRPO recipe: the trainer's memory on one device beside its rollout engine's.

The trainer is planned as pretraining's step is (``plan.py``): this device's share of the fp32 policy, its fp32
gradients and AdamW moments by the family's sharding plan, the activations of one micro-batch of completions and
the step's working memory; with a KL term, the frozen reference's share of fp32 weights (sharded as the policy
is). Each data rank's engine holds the whole model in the rollout's inference dtype (``rollout.dtype``, or
``rollout.vllm_dtype`` for vLLM) and a KV cache for the rows it decodes together: this rank's prompts times the
group size, each up to the run's sequence length (its longest prompt plus ``grpo.max_new_tokens``, as the trainer
pads its batches; without the prompts, the model's ``max_seq_len``, which bounds it), keys and values of every
layer in the same dtype. Legend: L layers, B rows, K key/value heads, S positions, D head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from titanpod.models import DecoderArgs, parameter_count
from titanpod.parallel import DATA_AXES
from titanpod.recipes.families import build_model, sharding_plan
from titanpod.recipes.planner.activations import block_saved_bytes, head_saved_bytes
from titanpod.recipes.planner.plan import _BYTES, MemoryPlan, _gathered_block_numel, _memory
from titanpod.recipes.posttrain.grpo_recipe import GRPORecipe


@dataclass(frozen=True)
class GRPOPlan:
    """Bytes on one device of a GRPO run: the trainer's, the KL reference's and the rollout engine's."""

    parameters: int
    """Parameters of the policy."""
    devices: int
    """Devices planned for (one process each)."""
    mesh: dict[str, int]
    """The mesh the policy is sharded over (axis -> size)."""
    engine_rows: int
    """Completions the engine decodes together (this data rank's prompts x the group size)."""
    seq_len: int
    """Positions a row reaches: the run's longest prompt plus ``grpo.max_new_tokens`` when the prompts were drawn,
    else the bound ``max_seq_len``."""
    inference_dtype: str
    """The dtype the engine holds its weights and KV cache in."""
    trainer: MemoryPlan
    """The trainer's bytes (its share of parameters, gradients, AdamW state; activations; working memory)."""
    reference: int
    """This device's share of the frozen KL reference's fp32 weights (0 without a KL term)."""
    engine_weights: int
    """The engine's whole copy of the weights in the inference dtype."""
    engine_kv_cache: int
    """The engine's KV cache: 2 (keys, values) x L x B x K x S x D x the inference dtype's bytes."""
    sync_transient: int
    """The most bytes one weight sync adds: the largest single weight gathered in the inference dtype."""

    @property
    def engine(self) -> int:
        """The engine's bytes: weights and KV cache."""
        return self.engine_weights + self.engine_kv_cache

    @property
    def total(self) -> int:
        """Predicted peak bytes on one device: trainer, reference, engine, and one weight in flight."""
        return self.trainer.total + self.reference + self.engine + self.sync_transient


def engine_kv_cache_bytes(args: DecoderArgs, rows: int, seq_len: int, dtype: torch.dtype) -> int:
    """Bytes of a KV cache holding ``rows`` rows of ``seq_len`` positions in ``dtype`` (every layer's keys and
    values, as ``titanpod.models.common.kv_cache.KVCache.allocate`` makes them)."""
    return 2 * args.n_layers * rows * args.n_kv_heads * seq_len * args.resolved_head_dim * dtype.itemsize


def plan_grpo(
    recipe: GRPORecipe, family: str, args: DecoderArgs, devices: int = 1, seq_len: int | None = None
) -> GRPOPlan:
    """Plan ``recipe`` for the policy ``family`` / ``args`` (its ``model.init_from`` folder's) on ``devices``
    devices, one process each; ``PlanError`` when the mesh does not fit the model. ``seq_len``: the run's
    sequence length (its longest prompt plus ``grpo.max_new_tokens``; default the bound ``args.max_seq_len``)."""
    if devices < 1:
        raise ValueError(f"A GRPO plan needs at least 1 device, got {devices}.")
    model = build_model(family, args)
    mesh = recipe.parallel.mesh_axes(devices)
    plan = sharding_plan(family)
    named = dict(model.named_parameters())
    plan.check(named, mesh)
    local = sum(plan.local_numel(name, tuple(p.shape), mesh) for name, p in named.items())
    data_ranks = math.prod(mesh[axis] for axis in DATA_AXES)
    grpo, train = recipe.grpo, recipe.train
    rows = grpo.prompts_per_step // data_ranks * grpo.group_size
    micro_rows = max(1, rows // train.grad_accum_steps)
    seq_len = args.max_seq_len if seq_len is None else seq_len
    compute = torch.bfloat16 if train.precision == "bf16" else torch.float32
    block = block_saved_bytes(args, micro_rows, seq_len, compute, mesh["tp"], recipe.parallel.sequence_parallel)
    head = head_saved_bytes(args, micro_rows, seq_len, compute, model.ops.head_loss)
    gathered = 0
    if mesh["fsdp"] * mesh["ep"] > 1:  # parameters are gathered a block at a time, one prefetched
        gathered = 2 * _gathered_block_numel(plan, model, mesh) * _BYTES[recipe.parallel.param_dtype]
    trainer = _memory(local, block, head, args.n_layers, train.memory_policy, gathered)
    dtype = getattr(torch, recipe.rollout.inference_dtype)
    parameters = parameter_count(model)
    return GRPOPlan(
        parameters=parameters,
        devices=devices,
        mesh=mesh,
        engine_rows=rows,
        seq_len=seq_len,
        inference_dtype=recipe.rollout.inference_dtype,
        trainer=trainer,
        reference=4 * local if grpo.kl_beta > 0 else 0,
        engine_weights=parameters * dtype.itemsize,
        engine_kv_cache=engine_kv_cache_bytes(args, rows, seq_len, dtype),
        sync_transient=max(p.numel() for p in named.values()) * dtype.itemsize,
    )
