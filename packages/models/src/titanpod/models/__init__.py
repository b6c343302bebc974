"""titanpod.models: single-device PyTorch model code, built on the meta device.

Llama 3, Qwen 3 and Qwen 3 MoE are one ``Transformer`` class configured by ``DecoderArgs``, each with
its named flavors (``titanpod.models.llama3`` ...); the Hugging Face adapters are in ``titanpod.models.adapters``.
A family as a whole (flavors, builder, plan, adapter, recipes) is one spec in ``titanpod.recipes.families``.
Each model takes a ``ModelOps`` for its swappable slots (attention, head + loss, expert
matmul, block runner); the defaults are PyTorch references.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from titanpod.models.common.args import DecoderArgs, MoEArgs
    from titanpod.models.common.block_runner import BlockCall, BlockRunner, blocks_in_order
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
    from titanpod.models.common.rope_scaling import Llama3RopeScaling
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

_HOMES = {
    "DecoderArgs": "titanpod.models.common.args",
    "MoEArgs": "titanpod.models.common.args",
    "BlockCall": "titanpod.models.common.block_runner",
    "BlockRunner": "titanpod.models.common.block_runner",
    "blocks_in_order": "titanpod.models.common.block_runner",
    "decoder_flops_per_token": "titanpod.models.common.counting",
    "parameter_count": "titanpod.models.common.counting",
    "ParamInit": "titanpod.models.common.init",
    "Region": "titanpod.models.common.init",
    "RegionValues": "titanpod.models.common.init",
    "region_initializer": "titanpod.models.common.init",
    "IGNORE_INDEX": "titanpod.models.common.ops",
    "ModelOps": "titanpod.models.common.ops",
    "batched_expert_matmul": "titanpod.models.common.ops",
    "document_causal_mask": "titanpod.models.common.ops",
    "linear_cross_entropy": "titanpod.models.common.ops",
    "positioned_form": "titanpod.models.common.ops",
    "sdpa_attention": "titanpod.models.common.ops",
    "Llama3RopeScaling": "titanpod.models.common.rope",
    "PositionedAttentionOp": "titanpod.models.common.sequence",
    "SequenceChunks": "titanpod.models.common.sequence",
    "SequenceShard": "titanpod.models.common.sequence",
    "WholeSequence": "titanpod.models.common.sequence",
    "positioned_causal_mask": "titanpod.models.common.sequence",
    "positioned_sdpa_attention": "titanpod.models.common.sequence",
    "Transformer": "titanpod.models.common.transformer",
    "FLUX_FLAVORS": "titanpod.models.flux",
    "FluxArgs": "titanpod.models.flux",
    "FluxOps": "titanpod.models.flux",
    "FluxTransformer": "titanpod.models.flux",
}
"""Where each public name lives: imported on first use, so a module of this package that needs none of them
(a config dataclass the command line reads) is imported without the rest."""

__all__ = [
    "FLUX_FLAVORS",
    "IGNORE_INDEX",
    "BlockCall",
    "BlockRunner",
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
    "blocks_in_order",
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


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'titanpod.models' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
