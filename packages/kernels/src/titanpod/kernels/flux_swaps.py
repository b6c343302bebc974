"""Choosing the op behind the FLUX.1 transformer's attention slot by the same ``KernelConfig`` the LLMs read.

FLUX has one slot, its joint text-image attention, unmasked. Of the LLM kernels it takes ``sdpa`` (the
reference) and ``splash`` (Splash attention with no mask, padded to its tiles); any other setting names a
slot or a kernel FLUX does not have and is refused, with the fix.
"""

from __future__ import annotations

from titanpod.kernels.splash import SplashAttention, SplashConfig
from titanpod.kernels.swaps import KernelConfig
from titanpod.models.flux.ops import FluxOps, full_sdpa_attention

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


def flux_ops(config: KernelConfig) -> FluxOps:
    """The ``FluxOps`` ``config`` asks for; ``ValueError`` listing every setting FLUX does not have."""
    problems = flux_kernel_problems(config)
    if problems:
        raise ValueError("The kernels asked for do not fit FLUX:\n  " + "\n  ".join(problems) + ".")
    if config.attention == "splash":
        tiles = config.splash
        unmasked = SplashConfig(tiles.block_q, tiles.block_kv, window=None, interpret=tiles.interpret, causal=False)
        return FluxOps(attention=SplashAttention(unmasked))
    return FluxOps(attention=full_sdpa_attention)
