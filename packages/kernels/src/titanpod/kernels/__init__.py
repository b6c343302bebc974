"""titanpod.kernels: JAX/Pallas functions as PyTorch ops, swapped into model slots by config.

``jax_op`` turns a JAX function into a traceable PyTorch op with autograd. On it stand
Splash attention, the megablox grouped matmul and a Pallas output projection +
cross-entropy; beside them, a chunked version of that loss in plain PyTorch and a C++ flash
attention for the CPU lane (``cpu_flash``, built on first use).
``model_ops(KernelConfig)`` picks what fills each ``titanpod.models.ModelOps`` slot, and
``flux_ops(KernelConfig)`` the FLUX transformer's attention slot; the PyTorch references stay
the defaults.
"""

from titanpod.kernels.chunked_loss import chunked_linear_cross_entropy
from titanpod.kernels.cpu_attention import CpuFlashAttention
from titanpod.kernels.flux_swaps import flux_ops
from titanpod.kernels.grouped_matmul import GroupedMatmulConfig, MegabloxGroupedMatmul
from titanpod.kernels.jax_op import JaxOp, jax_op
from titanpod.kernels.pallas_loss import PallasLinearCrossEntropy, PallasLossConfig
from titanpod.kernels.splash import SplashAttention, SplashConfig, local_causal_sdpa
from titanpod.kernels.swaps import KernelConfig, model_ops

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
