"""Model families by name, and building a model on the meta device."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from titanpod.models.common.ops import ModelOps
from titanpod.models.llama3 import LLAMA3_FLAVORS, Llama3


@dataclass(frozen=True)
class ModelFamily:
    """How to build one family: its class and its named shapes."""

    name: str
    """Family name used in recipes, e.g. ``llama3``."""
    model_class: Callable[..., nn.Module]
    """Called as ``model_class(args, ops)``."""
    flavors: Mapping[str, Any]
    """Flavor name -> args dataclass."""


FAMILIES: Mapping[str, ModelFamily] = {"llama3": ModelFamily("llama3", Llama3, LLAMA3_FLAVORS)}
"""Every model family titanpod ships."""


def _choose(kind: str, name: str, options: Mapping[str, Any]) -> Any:
    if name in options:
        return options[name]
    close = difflib.get_close_matches(name, list(options), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise KeyError(f"Unknown {kind} {name!r}; choose one of {', '.join(options)}.{hint}")


def get_flavor(family: str, flavor: str) -> Any:
    """The args dataclass of ``family``'s ``flavor``; ``KeyError`` names the closest match."""
    return _choose(f"{family} flavor", flavor, _choose("model family", family, FAMILIES).flavors)


def build_model(
    family: str, flavor: str, ops: ModelOps | None = None, device: torch.device | str = "meta"
) -> nn.Module:
    """Build ``family``/``flavor`` with the given slot ops, uninitialised, on ``device``.

    On the meta device nothing is allocated; move with ``model.to_empty(device=...)`` and
    call ``model.init_weights(seed)``.
    """
    args = get_flavor(family, flavor)
    with torch.device(device):
        return FAMILIES[family].model_class(args, ops)
