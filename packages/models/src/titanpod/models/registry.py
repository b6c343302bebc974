"""Model families by name, and building a model on the meta device."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from titanpod.models.common.args import DecoderArgs
from titanpod.models.common.ops import ModelOps
from titanpod.models.common.transformer import Transformer
from titanpod.models.llama3 import LLAMA3_FLAVORS
from titanpod.models.qwen3 import QWEN3_FLAVORS
from titanpod.models.qwen3_moe import QWEN3_MOE_FLAVORS


@dataclass(frozen=True)
class ModelFamily:
    """One model family: its name and its named shapes (all are built as ``Transformer``)."""

    name: str
    """Family name used in recipes, e.g. ``llama3``."""
    flavors: Mapping[str, DecoderArgs]
    """Flavor name -> shape."""


FAMILIES: Mapping[str, ModelFamily] = {
    "llama3": ModelFamily("llama3", LLAMA3_FLAVORS),
    "qwen3": ModelFamily("qwen3", QWEN3_FLAVORS),
    "qwen3_moe": ModelFamily("qwen3_moe", QWEN3_MOE_FLAVORS),
}
"""Every model family titanpod ships."""


def choose(kind: str, name: str, options: Mapping[str, Any]) -> Any:
    """``options[name]``, or a ``KeyError`` that lists the options and names the closest."""
    if name in options:
        return options[name]
    close = difflib.get_close_matches(name, list(options), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise KeyError(f"Unknown {kind} {name!r}; choose one of {', '.join(options)}.{hint}")


def get_flavor(family: str, flavor: str) -> DecoderArgs:
    """The shape of ``family``'s ``flavor``; ``KeyError`` names the closest match."""
    return choose(f"{family} flavor", flavor, choose("model family", family, FAMILIES).flavors)


def build_model(
    family: str, flavor: str | DecoderArgs, ops: ModelOps | None = None, device: torch.device | str = "meta"
) -> Transformer:
    """Build ``family`` at a named ``flavor`` (or explicit args) with the given slot ops, uninitialised.

    On the meta device (the default) nothing is allocated; move with
    ``model.to_empty(device=...)`` and call ``model.init_weights(seed)``.
    """
    choose("model family", family, FAMILIES)
    args = get_flavor(family, flavor) if isinstance(flavor, str) else flavor
    with torch.device(device):
        return Transformer(args, ops)
