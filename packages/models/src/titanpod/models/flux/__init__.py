"""FLUX.1: the rectified-flow transformer (double- and single-stream blocks) and its flavors; its
diffusers adapter is ``titanpod.models.adapters.flux_transformer``.

The transformer takes a ``FluxOps`` for its attention slot; the default is the PyTorch
reference (non-causal SDPA).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from titanpod.models.flux.args import FLUX_FLAVORS, FluxArgs, flux_args_from_dict, flux_args_to_dict
    from titanpod.models.flux.counting import FluxMatmulParams, flux_flops_per_sample, flux_matmul_params
    from titanpod.models.flux.ops import FluxOps, FullAttentionOp, full_sdpa_attention
    from titanpod.models.flux.transformer import FluxTransformer, build_flux_transformer

_HOMES = {
    "FLUX_FLAVORS": "titanpod.models.flux.args",
    "FluxArgs": "titanpod.models.flux.args",
    "flux_args_from_dict": "titanpod.models.flux.args",
    "flux_args_to_dict": "titanpod.models.flux.args",
    "FluxMatmulParams": "titanpod.models.flux.counting",
    "flux_flops_per_sample": "titanpod.models.flux.counting",
    "flux_matmul_params": "titanpod.models.flux.counting",
    "FluxOps": "titanpod.models.flux.ops",
    "FullAttentionOp": "titanpod.models.flux.ops",
    "full_sdpa_attention": "titanpod.models.flux.ops",
    "FluxTransformer": "titanpod.models.flux.transformer",
    "build_flux_transformer": "titanpod.models.flux.transformer",
}
"""Where each public name lives: imported on first use, so a module of this package that needs none of them
(a config dataclass the command line reads) is imported without the rest."""

__all__ = [
    "FLUX_FLAVORS",
    "FluxArgs",
    "FluxMatmulParams",
    "FluxOps",
    "FluxTransformer",
    "FullAttentionOp",
    "build_flux_transformer",
    "flux_args_from_dict",
    "flux_args_to_dict",
    "flux_flops_per_sample",
    "flux_matmul_params",
    "full_sdpa_attention",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'titanpod.models.flux' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
