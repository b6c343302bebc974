"""The two shapes most named recipes take: a debug run on this machine, and a production run on a TPU slice."""

from __future__ import annotations

import dataclasses

from titanpod.checkpoint import CheckpointConfig
from titanpod.data.config import DataConfig
from titanpod.device import DeviceConfig
from titanpod.graph import TrainConfig
from titanpod.kernels import GroupedMatmulConfig, KernelConfig, PallasLossConfig, SplashConfig
from titanpod.parallel import ParallelConfig
from titanpod.recipes.recipe import ModelConfig, OutputConfig, Recipe, TargetConfig

TPU_KERNELS = KernelConfig(
    attention="splash",
    head_loss="pallas",
    expert_matmul="gmm",
    grouped_matmul=GroupedMatmulConfig(tile_rows=512, tile_in=1024, tile_out=1024),
)
"""Pallas kernels for every slot: Splash attention, fused head + loss, grouped expert matmul. gmm's tiles are
large: each row tile reads its expert's whole weight, each output-column tile every row, so at 128 x 128 x 128 a
Qwen3-235B-A22B layer's grouped matmuls moved about 8 GB each through HBM, and its step was bound by that."""

BF16_FSDP = ParallelConfig(param_dtype="bfloat16", reduce_dtype="float32")
"""SimpleFSDP over every device, gathering bf16 parameters and reducing fp32 gradients."""

ONE_CHIP_KERNELS = dataclasses.replace(
    TPU_KERNELS,
    splash=SplashConfig(block_q=1024, block_kv=1024, fused_backward=True),
    pallas_loss=PallasLossConfig(block_rows=512, block_vocab=1024),
)
"""The Pallas kernels with larger tiles and Splash's fused backward (one kernel for dq, dk and dv), measured
faster on one v5e chip for Qwen 3 0.6B at 4 x 4,096 tokens than the defaults (docs/tpu-chip.md)."""


def debug_recipe(name: str, family: str, steps: int = 100) -> Recipe:
    """``family``'s ``debug`` flavor on the built-in corpus and tokenizer: ``steps`` steps, minutes on a CPU."""
    return Recipe(
        name=name,
        model=ModelConfig(family=family, flavor="debug"),
        device=DeviceConfig(lane="auto"),
        data=DataConfig(source="builtin", seq_len=256, batch_size=8),  # the built-in tokenizer, or init_from's
        # warmup_steps unset: min(10, steps // 10), so --train.steps 5 needs no --train.warmup-steps
        train=TrainConfig(steps=steps, lr=3e-3, decay="cosine", min_lr_ratio=0.1, log_every=10),
        output=OutputConfig(),
        target=TargetConfig(chip="cpu", chips=1),
    )


def pod_recipe(
    name: str,
    family: str,
    flavor: str,
    target: TargetConfig,
    *,
    parallel: ParallelConfig = BF16_FSDP,
    tokenizer: str,
    seq_len: int,
    batch_size: int,
    lr: float,
    steps: int,
    warmup_steps: int,
    memory_policy: str = "recompute",
    capacity_factor: float | None = None,
    scan_layers: bool = False,
    kernels: KernelConfig = TPU_KERNELS,
) -> Recipe:
    """``family``'s ``flavor`` on ``target``: C4 through ``tokenizer``, whole-step compiled, bf16, Pallas kernels,
    validation every 1,000 steps and an async checkpoint every 500. ``scan_layers``: see
    ``TrainConfig.scan_layers`` (the xla lane's blocks as one loop)."""
    return Recipe(
        name=name,
        model=ModelConfig(family=family, flavor=flavor, capacity_factor=capacity_factor),
        device=DeviceConfig(lane="auto"),
        parallel=parallel,
        kernels=kernels,
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
            scan_layers=scan_layers,
        ),
        checkpoint=CheckpointConfig(every=500, keep_last=2, async_save=True),
        output=OutputConfig(),
        target=target,
    )
