"""titanpod.models: single-device PyTorch model code, built on the meta device.

Llama 3, Qwen 3 and Qwen 3 MoE are one ``Transformer`` class configured by ``DecoderArgs``, each with
its named flavors (``titanpod.models.llama3`` ...); the Hugging Face adapters are in ``titanpod.models.adapters``.
A family as a whole (flavors, builder, plan, adapter, recipes) is one spec in ``titanpod.recipes.families``.
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

__all__ = [
    "FLUX_FLAVORS",
    "IGNORE_INDEX",
    "DecoderArgs",
    "FluxArgs",
    "FluxOps",
    "FluxTransformer",
    "Llama3RopeScaling",
    "MoEArgs",
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
    "decoder_flops_per_token",
    "document_causal_mask",
    "linear_cross_entropy",
    "parameter_count",
    "positioned_causal_mask",
    "positioned_form",
    "positioned_sdpa_attention",
    "region_initializer",
    "sdpa_attention",
]
