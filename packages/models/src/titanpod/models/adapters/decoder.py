"""The Hugging Face adapter of the decoder LLMs (Llama 3, Qwen 3, Qwen 3 MoE): config.json through
``decoder_config``, and tensor names titanpod <-> Hugging Face, experts split one tensor per expert.

Legend: E experts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from titanpod.models.adapters.base import HFSlot, StateDictAdapter, UnsupportedConfigError
from titanpod.models.adapters.decoder_config import (
    DecoderHFForm,
    args_from_hf_config,
    family_of_hf_config,
    hf_config_from_args,
    sliding_window_config,
)
from titanpod.models.common.args import DecoderArgs

if TYPE_CHECKING:
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


def hf_name_to_slot(hf_name: str) -> HFSlot | None:
    """The titanpod slot of a Hugging Face tensor name, or ``None`` if the name is not one titanpod knows."""
    if hf_name in _TOP_LEVEL:
        return HFSlot(_TOP_LEVEL[hf_name])
    layer = _LAYER.match(hf_name)
    if layer is None:
        return None
    index, rest = layer.groups()
    if rest in _PER_LAYER:
        return HFSlot(f"layers.{index}.{_PER_LAYER[rest]}")
    expert = _EXPERT.match(rest)
    if expert is None:
        return None
    return HFSlot(f"layers.{index}.feed_forward.experts.{_PER_EXPERT[expert.group(2)]}", expert=int(expert.group(1)))


def _hf_name(name: str, expert: int | None) -> str:
    if name in _TOP_LEVEL_BACK:
        return _TOP_LEVEL_BACK[name]
    _, index, rest = name.split(".", 2)
    if expert is None:
        return f"model.layers.{index}.{_PER_LAYER_BACK[rest]}"
    projection = _PER_EXPERT_BACK[rest.rsplit(".", 1)[1]]
    return f"model.layers.{index}.mlp.experts.{expert}.{projection}.weight"


@lru_cache(maxsize=8)
def decoder_hf_layout(args: DecoderArgs) -> Mapping[str, HFSlot]:
    """Every Hugging Face tensor name of a decoder of shape ``args`` -> its titanpod slot, in parameter
    order with experts one by one. Cached per ``args`` and read-only."""
    import torch  # here: reading the adapters (a recipe's families) needs no torch

    from titanpod.models.common.transformer import Transformer

    with torch.device("meta"):
        model = Transformer(args)
    layout: dict[str, HFSlot] = {}
    for name, param in model.named_parameters():
        if ".experts." in name:
            for expert in range(param.shape[0]):
                layout[_hf_name(name, expert)] = HFSlot(name, expert=expert)
        else:
            layout[_hf_name(name, None)] = HFSlot(name)
    return MappingProxyType(layout)


@dataclass(frozen=True)
class DecoderAdapter(StateDictAdapter[DecoderArgs]):
    """The Hugging Face form of one decoder family (e.g. ``llama3``, ``qwen3`` or ``qwen3_moe``)."""

    family: str
    """titanpod family name, as recipes and model.json name it."""
    form: DecoderHFForm
    """The Hugging Face class the family is read from and written as."""

    def args_from_hf_config(self, config: Mapping[str, Any]) -> DecoderArgs:
        """``DecoderArgs`` of a config.json of this family; another class's config is an ``UnsupportedConfigError``."""
        if not self.form.describes(config):
            described = config.get("architectures") or config.get("model_type")
            raise UnsupportedConfigError(
                f"config.json describes {described!r}, not {self.form.architecture} ({self.family})."
            )
        return args_from_hf_config(config, self.form)

    def hf_config_from_args(self, args: DecoderArgs, dtype: torch.dtype) -> dict[str, Any]:
        """config.json in the published checkpoints' style, its ``dtype`` field set to ``dtype``."""
        return hf_config_from_args(self.form, args, str(dtype).removeprefix("torch."))

    def window_config(self, window: int | None) -> dict[str, Any]:
        """config.json's fields for ``kernels.window``; see ``sliding_window_config``."""
        return sliding_window_config(self.form, window)

    def hf_layout(self, args: DecoderArgs) -> Mapping[str, HFSlot]:
        """See ``decoder_hf_layout``."""
        return decoder_hf_layout(args)


def adapter_of_hf_config(config: Mapping[str, Any], adapters: Mapping[str, DecoderAdapter]) -> DecoderAdapter:
    """The adapter among ``adapters`` (family -> adapter) whose Hugging Face class ``config`` describes;
    ``UnsupportedConfigError`` lists the classes known."""
    return adapters[family_of_hf_config(config, {family: adapter.form for family, adapter in adapters.items()})]


def hf_tensors(model: Transformer) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of ``model`` under its Hugging Face name, experts one by one (views, no copies)."""
    params = dict(model.named_parameters())
    for hf_name, slot in decoder_hf_layout(model.args).items():
        yield hf_name, slot.view(params[slot.name])
