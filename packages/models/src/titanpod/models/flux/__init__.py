"""FLUX.1: the rectified-flow transformer (double- and single-stream blocks) and its flavors; its
diffusers adapter is ``titanpod.models.adapters.flux_transformer``.

The transformer takes a ``FluxOps`` for its attention slot; the default is the PyTorch
reference (non-causal SDPA).
"""

from titanpod.models.flux.args import FLUX_FLAVORS, FluxArgs, flux_args_from_dict, flux_args_to_dict
from titanpod.models.flux.counting import FluxMatmulParams, flux_flops_per_sample, flux_matmul_params
from titanpod.models.flux.ops import FluxOps, FullAttentionOp, full_sdpa_attention
from titanpod.models.flux.transformer import FluxTransformer, build_flux_transformer

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
