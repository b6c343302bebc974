"""Choosing the op behind the FLUX.1 transformer's attention slot by the same ``KernelConfig`` the LLMs read.

FLUX has one slot, its joint text-image attention, unmasked. Of the LLM kernels it takes ``sdpa`` (the
reference) and ``splash`` (Splash attention with no mask, padded to its tiles); any other setting names a
slot or a kernel FLUX does not have and is refused, with the fix.
"""

from __future__ import annotations

import dataclasses

from titanpod.kernels.config import KernelConfig, flux_kernel_problems
from titanpod.kernels.splash import SplashAttention
from titanpod.models.flux.ops import FluxOps, full_sdpa_attention


def flux_ops(config: KernelConfig) -> FluxOps:
    """The ``FluxOps`` ``config`` asks for; ``ValueError`` listing every setting FLUX does not have."""
    problems = flux_kernel_problems(config)
    if problems:
        raise ValueError("The kernels asked for do not fit FLUX:\n  " + "\n  ".join(problems) + ".")
    if config.attention == "splash":
        tiles = config.splash
        unmasked = dataclasses.replace(tiles, window=None, causal=False)
        return FluxOps(attention=SplashAttention(unmasked))
    return FluxOps(attention=full_sdpa_attention)
