"""titanpod.kernels: JAX/Pallas functions as PyTorch ops, swapped into model slots by config.

``jax_op`` turns a JAX function into a traceable PyTorch op with autograd. On it stand
Splash attention, the megablox grouped matmul and a Pallas output projection +
cross-entropy; beside them, a chunked version of that loss in plain PyTorch and a C++ flash
attention for the CPU lane (``cpu_flash``, built on first use).
``model_ops(KernelConfig)`` picks what fills each ``titanpod.models.ModelOps`` slot, and
``flux_ops(KernelConfig)`` the FLUX transformer's attention slot; the PyTorch references stay
the defaults.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from titanpod.kernels.chunked_loss import chunked_linear_cross_entropy
    from titanpod.kernels.config import KernelConfig
    from titanpod.kernels.cpu_attention import CpuFlashAttention
    from titanpod.kernels.flux_swaps import flux_ops
    from titanpod.kernels.grouped_matmul import GroupedMatmulConfig, MegabloxGroupedMatmul
    from titanpod.kernels.jax_custom_op import JaxOp, jax_op
    from titanpod.kernels.pallas_loss import PallasLinearCrossEntropy, PallasLossConfig
    from titanpod.kernels.splash import SplashAttention, SplashConfig, local_causal_sdpa
    from titanpod.kernels.swaps import model_ops

_HOMES = {
    "chunked_linear_cross_entropy": "titanpod.kernels.chunked_loss",
    "CpuFlashAttention": "titanpod.kernels.cpu_attention",
    "flux_ops": "titanpod.kernels.flux_swaps",
    "GroupedMatmulConfig": "titanpod.kernels.pallas.gmm_kernel",
    "MegabloxGroupedMatmul": "titanpod.kernels.grouped_matmul",
    "JaxOp": "titanpod.kernels.jax_custom_op",
    "jax_op": "titanpod.kernels.jax_custom_op",
    "PallasLinearCrossEntropy": "titanpod.kernels.pallas_loss",
    "PallasLossConfig": "titanpod.kernels.pallas.loss_kernel",
    "SplashAttention": "titanpod.kernels.splash",
    "SplashConfig": "titanpod.kernels.pallas.splash_kernel",
    "local_causal_sdpa": "titanpod.kernels.splash",
    "KernelConfig": "titanpod.kernels.config",
    "model_ops": "titanpod.kernels.swaps",
}
"""Where each public name lives: imported on first use, so a module of this package that needs none of them
(a config dataclass the command line reads) is imported without the rest."""

__all__ = [
    "CpuFlashAttention",
    "GroupedMatmulConfig",
    "JaxOp",
    "KernelConfig",
    "MegabloxGroupedMatmul",
    "PallasLinearCrossEntropy",
    "PallasLossConfig",
    "SplashAttention",
    "SplashConfig",
    "chunked_linear_cross_entropy",
    "flux_ops",
    "jax_op",
    "local_causal_sdpa",
    "model_ops",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'titanpod.kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
