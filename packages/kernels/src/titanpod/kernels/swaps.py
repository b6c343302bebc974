"""Choosing the ops behind a model's slots by config, before the model is built."""

from __future__ import annotations

import dataclasses
import functools
from typing import get_args

from titanpod.kernels.chunked_loss import chunked_linear_cross_entropy
from titanpod.kernels.config import AttentionKernel, ExpertMatmulKernel, HeadLossKernel, KernelConfig
from titanpod.kernels.cpu_attention import CpuFlashAttention
from titanpod.kernels.grouped_matmul import MegabloxGroupedMatmul
from titanpod.kernels.math_attention import MathAttention
from titanpod.kernels.pallas_loss import PallasLinearCrossEntropy
from titanpod.kernels.splash import SplashAttention, local_causal_sdpa
from titanpod.kernels.tpu_splash import TorchTpuSplashAttention
from titanpod.models import ModelOps, batched_expert_matmul, linear_cross_entropy, sdpa_attention
from titanpod.models.common.ops import HeadLossOp

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
    if not config.splash.causal:
        raise ValueError(
            "kernels.splash.causal=False is FLUX's unmasked attention (titanpod-diffusion sets it itself); a "
            "decoder's attention is causal: drop --kernels.splash.no-causal."
        )
    splash = dataclasses.replace(config.splash, window=config.window)
    if config.attention == "splash":
        attention = SplashAttention(splash)
    elif config.attention == "splash_sdpa":
        if splash.fused_backward:
            raise ValueError(
                "kernels.splash.fused_backward is a setting of JAX's Splash kernel (kernels.attention 'splash'); "
                "torch_tpu's splash_sdpa has a backward of its own: drop --kernels.splash.fused-backward."
            )
        attention = TorchTpuSplashAttention(splash)
    elif config.attention == "cpu_flash":
        attention = CpuFlashAttention(config.window)
    elif config.attention == "math":
        attention = MathAttention(config.window)
    else:
        attention = sdpa_attention if config.window is None else local_causal_sdpa(config.window)
    head_loss: HeadLossOp = linear_cross_entropy
    if config.head_loss == "chunked":
        head_loss = functools.partial(chunked_linear_cross_entropy, chunk_rows=config.chunk_rows)
    elif config.head_loss == "pallas":
        head_loss = PallasLinearCrossEntropy(config.pallas_loss)
    expert = MegabloxGroupedMatmul(config.grouped_matmul) if config.expert_matmul == "gmm" else batched_expert_matmul
    return ModelOps(attention=attention, head_loss=head_loss, expert_matmul=expert)
