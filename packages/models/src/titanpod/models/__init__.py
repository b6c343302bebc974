"""titanpod.models: single-device PyTorch model code, built on the meta device.

Llama 3, Qwen 3 and Qwen 3 MoE are one ``Transformer`` class configured by ``DecoderArgs``;
a family is a set of named flavors and a Hugging Face adapter (``titanpod.models.adapters``).
Each model takes a ``ModelOps`` for its swappable slots (attention, head + loss, expert
matmul); the defaults are PyTorch references.
"""

from titanpod.models.common.args import DecoderArgs, MoEArgs
from titanpod.models.common.counting import decoder_flops_per_token, parameter_count
from titanpod.models.common.init import ParamInit, Region, RegionValues, region_initializer
from titanpod.models.common.ops import (
    IGNORE_INDEX,
    ModelOps,
    batched_expert_matmul,
    document_causal_mask,
    linear_cross_entropy,
    positioned_form,
    sdpa_attention,
)
from titanpod.models.common.rope import Llama3RopeScaling
from titanpod.models.common.sequence import (
    PositionedAttentionOp,
    SequenceChunks,
    SequenceShard,
    WholeSequence,
    positioned_causal_mask,
    positioned_sdpa_attention,
)
from titanpod.models.common.transformer import Transformer
from titanpod.models.flux import FLUX_FLAVORS, FluxArgs, FluxOps, FluxTransformer
from titanpod.models.registry import FAMILIES, ModelFamily, build_model, get_flavor

__all__ = [
    "FAMILIES",
    "FLUX_FLAVORS",
    "IGNORE_INDEX",
    "DecoderArgs",
    "FluxArgs",
    "FluxOps",
    "FluxTransformer",
    "Llama3RopeScaling",
    "MoEArgs",
    "ModelFamily",
    "ModelOps",
    "ParamInit",
    "PositionedAttentionOp",
    "Region",
    "RegionValues",
    "SequenceChunks",
    "SequenceShard",
    "Transformer",
    "WholeSequence",
    "batched_expert_matmul",
    "build_model",
    "decoder_flops_per_token",
    "document_causal_mask",
    "get_flavor",
    "linear_cross_entropy",
    "parameter_count",
    "positioned_causal_mask",
    "positioned_form",
    "positioned_sdpa_attention",
    "region_initializer",
    "sdpa_attention",
]
