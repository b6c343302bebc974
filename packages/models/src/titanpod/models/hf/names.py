"""Tensor names: titanpod's parameters <-> Hugging Face's, experts split one tensor per expert.

Legend: E experts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

import torch

from titanpod.models.common.transformer import Transformer

_TOP_LEVEL = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
_PER_LAYER = {
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "self_attn.q_norm.weight": "attention.q_norm.weight",
    "self_attn.k_norm.weight": "attention.k_norm.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "mlp.gate.weight": "feed_forward.router.weight",
}
_PER_EXPERT = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")

_TOP_LEVEL_BACK = {ours: theirs for theirs, ours in _TOP_LEVEL.items()}
_PER_LAYER_BACK = {ours: theirs for theirs, ours in _PER_LAYER.items()}
_PER_EXPERT_BACK = {ours: theirs for theirs, ours in _PER_EXPERT.items()}


class HFSlot(NamedTuple):
    """Where a Hugging Face tensor goes: a titanpod parameter, or one expert's slice of it."""

    name: str
    """titanpod parameter name."""
    expert: int | None
    """Expert index into the parameter's first dimension, or ``None`` for the whole tensor."""


def hf_name_to_slot(hf_name: str) -> HFSlot | None:
    """The titanpod slot of a Hugging Face tensor name, or ``None`` if the name is not one titanpod knows."""
    if hf_name in _TOP_LEVEL:
        return HFSlot(_TOP_LEVEL[hf_name], None)
    layer = _LAYER.match(hf_name)
    if layer is None:
        return None
    index, rest = layer.groups()
    if rest in _PER_LAYER:
        return HFSlot(f"layers.{index}.{_PER_LAYER[rest]}", None)
    expert = _EXPERT.match(rest)
    if expert is None:
        return None
    return HFSlot(f"layers.{index}.feed_forward.experts.{_PER_EXPERT[expert.group(2)]}", int(expert.group(1)))


def _hf_name(name: str, expert: int | None) -> str:
    if name in _TOP_LEVEL_BACK:
        return _TOP_LEVEL_BACK[name]
    _, index, rest = name.split(".", 2)
    if expert is None:
        return f"model.layers.{index}.{_PER_LAYER_BACK[rest]}"
    projection = _PER_EXPERT_BACK[rest.rsplit(".", 1)[1]]
    return f"model.layers.{index}.mlp.experts.{expert}.{projection}.weight"


def hf_tensors(model: Transformer) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of ``model`` under its Hugging Face name, experts one by one (views, no copies)."""
    for name, param in model.named_parameters():
        if ".experts." in name:
            for expert in range(param.shape[0]):
                yield _hf_name(name, expert), param[expert]
        else:
            yield _hf_name(name, None), param
