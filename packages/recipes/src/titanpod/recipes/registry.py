"""Named recipes: one function each, listed by ``titanpod-pretrain --list-recipes``.

The debug recipes train on this machine in minutes. The others describe a production run
on the slice named in their ``target``: ``titanpod-pretrain --recipe NAME --dry-run``
shows what that costs, and the same recipe runs on the pod unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from titanpod.checkpoint import CheckpointConfig
from titanpod.data.config import DataConfig
from titanpod.device import DeviceConfig
from titanpod.graph import TrainConfig
from titanpod.kernels import KernelConfig
from titanpod.models.registry import choose
from titanpod.parallel import ParallelConfig
from titanpod.recipes.recipe import ModelConfig, OutputConfig, Recipe, TargetConfig

_TPU_KERNELS = KernelConfig(attention="splash", head_loss="pallas", expert_matmul="gmm")
"""Pallas kernels for every slot: Splash attention, fused head + loss, grouped expert matmul."""

_BF16_FSDP = ParallelConfig(param_dtype="bfloat16", reduce_dtype="float32")
"""SimpleFSDP over every device, gathering bf16 parameters and reducing fp32 gradients."""


def _debug(name: str, family: str, steps: int = 100) -> Recipe:
    return Recipe(
        name=name,
        model=ModelConfig(family=family, flavor="debug"),
        device=DeviceConfig(lane="auto"),
        data=DataConfig(source="builtin", tokenizer="builtin", seq_len=256, batch_size=8),
        # warmup_steps unset: min(10, steps // 10), so --train.steps 5 needs no --train.warmup-steps
        train=TrainConfig(steps=steps, lr=3e-3, decay="cosine", min_lr_ratio=0.1, log_every=10),
        output=OutputConfig(),
        target=TargetConfig(chip="cpu", chips=1),
    )


def _pod(
    name: str,
    family: str,
    flavor: str,
    target: TargetConfig,
    *,
    parallel: ParallelConfig = _BF16_FSDP,
    tokenizer: str,
    seq_len: int,
    batch_size: int,
    lr: float,
    steps: int,
    warmup_steps: int,
    memory_policy: str = "recompute",
    capacity_factor: float | None = None,
) -> Recipe:
    return Recipe(
        name=name,
        model=ModelConfig(family=family, flavor=flavor, capacity_factor=capacity_factor),
        device=DeviceConfig(lane="auto"),
        parallel=parallel,
        kernels=_TPU_KERNELS,
        data=DataConfig(
            source="hub",
            path="allenai/c4",
            name="en",
            tokenizer=tokenizer,
            seq_len=seq_len,
            batch_size=batch_size,
            validation_split="validation",
            validation_every=1000,
        ),
        train=TrainConfig(
            steps=steps,
            lr=lr,
            warmup_steps=warmup_steps,
            decay="cosine",
            min_lr_ratio=0.1,
            weight_decay=0.1,
            grad_clip=1.0,
            log_every=10,
            step_mode="whole_step",
            memory_policy=memory_policy,
            precision="bf16",
        ),
        checkpoint=CheckpointConfig(every=500, keep_last=2, async_save=True),
        output=OutputConfig(),
        target=target,
    )


def llama3_debug() -> Recipe:
    """Llama 3 debug model (6 layers, dim 256) on the built-in corpus: 100 steps, minutes on a CPU."""
    return _debug("llama3_debug", "llama3")


def llama3_8b() -> Recipe:
    """Llama 3.1 8B on a TPU v6e-256: FSDP, recomputed blocks, 8K sequences, Pallas kernels."""
    return _pod(
        "llama3_8b", "llama3", "8B", TargetConfig(chip="v6e", chips=256),
        tokenizer="meta-llama/Llama-3.1-8B", seq_len=8192, batch_size=2, lr=3e-4, steps=10_000, warmup_steps=500,
    )  # fmt: skip


def llama3_70b() -> Recipe:
    """Llama 3.1 70B on a TPU v5p-512 (256 chips): FSDP, recomputed blocks, 8K sequences, Pallas kernels."""
    return _pod(
        "llama3_70b", "llama3", "70B", TargetConfig(chip="v5p", chips=256),
        tokenizer="meta-llama/Llama-3.1-70B", seq_len=8192, batch_size=2, lr=1.5e-4, steps=10_000, warmup_steps=1000,
    )  # fmt: skip


def llama3_405b() -> Recipe:
    """Llama 3.1 405B on a TPU v5p-1024 (512 chips): FSDP 64 x TP 8 with sequence parallelism, recomputed
    blocks, 8K sequences."""
    return _pod(
        "llama3_405b", "llama3", "405B", TargetConfig(chip="v5p", chips=512),
        parallel=ParallelConfig(fsdp=-1, tp=8, param_dtype="bfloat16", reduce_dtype="float32"),
        tokenizer="meta-llama/Llama-3.1-405B", seq_len=8192, batch_size=2, lr=8e-5, steps=10_000, warmup_steps=2000,
    )  # fmt: skip


def llama3_405b_pp() -> Recipe:
    """Llama 3.1 405B over two TPU v5p-1024 slices (1024 chips): pipeline stages across the slices (pp 2, 1F1B,
    8 micro-batches of one 8K sequence a data rank), FSDP 64 x TP 8 within each. Only activations cross
    between slices. Eager steps (a pipeline does not run as one captured step) with each layer recomputed in
    its backward (``parallel.pp_recompute``); no validation (a pipeline rank holds half the model)."""
    base = llama3_405b()
    return dataclasses.replace(
        base,
        name="llama3_405b_pp",
        target=TargetConfig(chip="v5p", chips=1024),
        parallel=dataclasses.replace(base.parallel, pp=2, pp_schedule="1f1b", pp_microbatches=8, pp_recompute=True),
        data=dataclasses.replace(base.data, batch_size=1, validation_split=None, validation_every=0),
        train=dataclasses.replace(base.train, grad_accum_steps=8, step_mode="eager", memory_policy="save"),
    )


def qwen3_debug() -> Recipe:
    """Qwen 3 debug model (4 layers, dim 256, q/k norms, tied embeddings) on the built-in corpus."""
    return _debug("qwen3_debug", "qwen3")


def qwen3_8b() -> Recipe:
    """Qwen 3 8B on a TPU v6e-64: FSDP, selective activation memory, 4K sequences, Pallas kernels."""
    return _pod(
        "qwen3_8b", "qwen3", "8B", TargetConfig(chip="v6e", chips=64),
        tokenizer="Qwen/Qwen3-8B", seq_len=4096, batch_size=2, lr=3e-4, steps=10_000, warmup_steps=500,
        memory_policy="selective",
    )  # fmt: skip


def qwen3_32b() -> Recipe:
    """Qwen 3 32B on a TPU v5p-256 (128 chips): FSDP, recomputed blocks, 4K sequences, Pallas kernels."""
    return _pod(
        "qwen3_32b", "qwen3", "32B", TargetConfig(chip="v5p", chips=128),
        tokenizer="Qwen/Qwen3-32B", seq_len=4096, batch_size=4, lr=2e-4, steps=10_000, warmup_steps=1000,
    )  # fmt: skip


def qwen3_moe_debug() -> Recipe:
    """Qwen 3 MoE debug model (8 experts, top 2) on the built-in corpus."""
    return _debug("qwen3_moe_debug", "qwen3_moe")


def qwen3_235b_a22b() -> Recipe:
    """Qwen 3 235B-A22B (128 experts, top 8) on a TPU v6e-256: FSDP 32 x EP 8, recomputed blocks, 4K sequences.

    Each expert takes 1.25x its fair share of a batch's routed tokens (choices past that are
    dropped and counted): with static shapes, no capacity limit would give every one of the
    128 experts a buffer of the whole batch, 16x the expert compute and all-to-all traffic.
    """
    return _pod(
        "qwen3_235b_a22b", "qwen3_moe", "235B-A22B", TargetConfig(chip="v6e", chips=256),
        parallel=ParallelConfig(fsdp=-1, ep=8, param_dtype="bfloat16", reduce_dtype="float32"),
        capacity_factor=1.25,
        tokenizer="Qwen/Qwen3-235B-A22B", seq_len=4096, batch_size=1, lr=1e-4, steps=10_000, warmup_steps=1000,
    )  # fmt: skip


RECIPES: Mapping[str, Callable[[], Recipe]] = {
    recipe.__name__: recipe
    for recipe in (
        llama3_debug,
        llama3_8b,
        llama3_70b,
        llama3_405b,
        llama3_405b_pp,
        qwen3_debug,
        qwen3_8b,
        qwen3_32b,
        qwen3_moe_debug,
        qwen3_235b_a22b,
    )
}
"""Every named recipe."""

DEFAULT_RECIPE = "llama3_debug"


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; ``KeyError`` names the closest one."""
    return choose("recipe", name, RECIPES)()
