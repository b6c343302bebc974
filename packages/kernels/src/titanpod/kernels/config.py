"""Which kernel fills each of a model's slots, as a recipe states it (``KernelConfig``), and what FLUX cannot run
of it: plain data, read without torch or JAX (the command line reads every recipe's kernels);
``titanpod.kernels.swaps`` and ``titanpod.kernels.flux_swaps`` turn it into ops."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from titanpod.kernels.pallas.gmm_kernel import GroupedMatmulConfig
from titanpod.kernels.pallas.loss_kernel import PallasLossConfig
from titanpod.kernels.pallas.splash_kernel import SplashConfig
from titanpod.models.field_checks import SAME_MATHS

AttentionKernel = Literal["sdpa", "splash", "splash_sdpa", "cpu_flash", "math"]
"""What ``KernelConfig.attention`` accepts."""
HeadLossKernel = Literal["reference", "chunked", "pallas"]
"""What ``KernelConfig.head_loss`` accepts."""
ExpertMatmulKernel = Literal["loop", "gmm"]
"""What ``KernelConfig.expert_matmul`` accepts."""


@dataclass(frozen=True)
class KernelConfig:
    """Which implementation fills each slot.

    A field marked ``SAME_MATHS`` picks an implementation of the same maths, which a resumed run may change; the
    others (``window``, and the splash mask's own fields) change what the model computes.
    """

    attention: AttentionKernel = field(default="sdpa", metadata=SAME_MATHS)
    """``sdpa`` (PyTorch's scaled_dot_product_attention), ``splash`` (Pallas splash attention through
    JAX, every lane), ``splash_sdpa`` (torch_tpu's own splash kernel: the tpu lane only, no packed documents)
    or ``cpu_flash`` (a C++ flash attention built on first use: the cpu lane only, head dims 16 to 128,
    fastest against ``sdpa`` at 16 and 32) or ``math`` (scores, mask and softmax in plain PyTorch ops: every
    lane, no attention kernel, the whole score matrix in memory; for a torch_tpu whose SDPA kernel the installed
    libtpu cannot compile)."""
    head_loss: HeadLossKernel = field(default="reference", metadata=SAME_MATHS)
    """``reference`` (full logits + cross-entropy), ``chunked`` (PyTorch, never holds all logits) or
    ``pallas`` (Pallas kernels for the TPU, likewise)."""
    expert_matmul: ExpertMatmulKernel = field(default="loop", metadata=SAME_MATHS)
    """``loop`` (the PyTorch reference: one batched matmul over the experts' fixed-size buffers) or ``gmm``
    (megablox grouped matmul)."""
    window: int | None = None
    """Local attention window for every attention kernel (keys before each query); ``None`` is causal."""
    splash: SplashConfig = field(default_factory=SplashConfig)
    """Splash attention's tiles (its window comes from ``window``)."""
    grouped_matmul: GroupedMatmulConfig = field(default_factory=GroupedMatmulConfig, metadata=SAME_MATHS)
    """Grouped matmul tiles."""
    pallas_loss: PallasLossConfig = field(default_factory=PallasLossConfig, metadata=SAME_MATHS)
    """Tiles of the Pallas cross-entropy."""
    chunk_rows: int | None = field(default=None, metadata=SAME_MATHS)
    """Rows of logits per chunk for ``chunked``; ``None`` fits 256 MiB of fp32 logits."""


FLUX_ATTENTION = ("sdpa", "splash")
"""The ``kernels.attention`` settings FLUX runs."""


def flux_kernel_problems(config: KernelConfig) -> list[str]:
    """What in ``config`` FLUX cannot run, each with its fix; empty when it runs all of it."""
    defaults = KernelConfig()
    problems = []
    if config.attention not in FLUX_ATTENTION:
        problems.append(
            f"kernels.attention {config.attention!r}: FLUX's unmasked joint attention runs "
            f"{' or '.join(FLUX_ATTENTION)}; choose one of them"
        )
    if config.window is not None:
        problems.append(f"kernels.window {config.window}: FLUX's attention is unmasked; leave kernels.window unset")
    if config.head_loss != defaults.head_loss:
        problems.append(
            f"kernels.head_loss {config.head_loss!r}: FLUX has no vocabulary head (its loss is flow matching); "
            f"leave it {defaults.head_loss!r}"
        )
    if config.expert_matmul != defaults.expert_matmul:
        problems.append(
            f"kernels.expert_matmul {config.expert_matmul!r}: FLUX has no experts; leave it {defaults.expert_matmul!r}"
        )
    return problems
