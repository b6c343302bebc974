"""Choosing the ops behind a model's slots by config, before the model is built."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal, get_args

from titanpod.kernels.chunked_loss import chunked_linear_cross_entropy
from titanpod.kernels.cpu_attention import CpuFlashAttention
from titanpod.kernels.grouped_matmul import GroupedMatmulConfig, MegabloxGroupedMatmul
from titanpod.kernels.pallas_loss import PallasLinearCrossEntropy, PallasLossConfig
from titanpod.kernels.splash import SplashAttention, SplashConfig, local_causal_sdpa
from titanpod.kernels.tpu_splash import TorchTpuSplashAttention
from titanpod.models import ModelOps, batched_expert_matmul, linear_cross_entropy, sdpa_attention
from titanpod.models.common.ops import HeadLossOp

AttentionKernel = Literal["sdpa", "splash", "splash_sdpa", "cpu_flash"]
"""What ``KernelConfig.attention`` accepts."""
HeadLossKernel = Literal["reference", "chunked", "pallas"]
"""What ``KernelConfig.head_loss`` accepts."""
ExpertMatmulKernel = Literal["loop", "gmm"]
"""What ``KernelConfig.expert_matmul`` accepts."""


@dataclass(frozen=True)
class KernelConfig:
    """Which implementation fills each slot."""

    attention: AttentionKernel = "sdpa"
    """``sdpa`` (PyTorch's scaled_dot_product_attention), ``splash`` (Pallas splash attention through
    JAX, every lane), ``splash_sdpa`` (torch_tpu's own splash kernel: the tpu lane only, no packed documents)
    or ``cpu_flash`` (a C++ flash attention built on first use: the cpu lane only, head dims 16 to 128,
    fastest against ``sdpa`` at 16 and 32)."""
    head_loss: HeadLossKernel = "reference"
    """``reference`` (full logits + cross-entropy), ``chunked`` (PyTorch, never holds all logits) or
    ``pallas`` (Pallas kernels for the TPU, likewise)."""
    expert_matmul: ExpertMatmulKernel = "loop"
    """``loop`` (the PyTorch reference: one batched matmul over the experts' fixed-size buffers) or ``gmm``
    (megablox grouped matmul)."""
    window: int | None = None
    """Local attention window for every attention kernel (keys before each query); ``None`` is causal."""
    splash: SplashConfig = field(default_factory=SplashConfig)
    """Splash attention's tiles (its window comes from ``window``)."""
    grouped_matmul: GroupedMatmulConfig = field(default_factory=GroupedMatmulConfig)
    """Grouped matmul tiles."""
    pallas_loss: PallasLossConfig = field(default_factory=PallasLossConfig)
    """Tiles of the Pallas cross-entropy."""
    chunk_rows: int | None = None
    """Rows of logits per chunk for ``chunked``; ``None`` fits 256 MiB of fp32 logits."""


_CHOICES = {
    "attention": get_args(AttentionKernel),
    "head_loss": get_args(HeadLossKernel),
    "expert_matmul": get_args(ExpertMatmulKernel),
}


def model_ops(config: KernelConfig) -> ModelOps:
    """The ``ModelOps`` a config asks for; ``ValueError`` names a choice that does not exist."""
    for slot, options in _CHOICES.items():
        if getattr(config, slot) not in options:
            raise ValueError(f"kernels.{slot} must be one of {', '.join(options)}, got {getattr(config, slot)!r}.")
    splash = SplashConfig(config.splash.block_q, config.splash.block_kv, config.window, config.splash.interpret)
    if config.attention == "splash":
        attention = SplashAttention(splash)
    elif config.attention == "splash_sdpa":
        attention = TorchTpuSplashAttention(splash)
    elif config.attention == "cpu_flash":
        attention = CpuFlashAttention(config.window)
    else:
        attention = sdpa_attention if config.window is None else local_causal_sdpa(config.window)
    head_loss: HeadLossOp = linear_cross_entropy
    if config.head_loss == "chunked":
        head_loss = functools.partial(chunked_linear_cross_entropy, chunk_rows=config.chunk_rows)
    elif config.head_loss == "pallas":
        head_loss = PallasLinearCrossEntropy(config.pallas_loss)
    expert = MegabloxGroupedMatmul(config.grouped_matmul) if config.expert_matmul == "gmm" else batched_expert_matmul
    return ModelOps(attention=attention, head_loss=head_loss, expert_matmul=expert)
