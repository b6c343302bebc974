"""Every model family titanpod ships, by name, and the lookups every registry of families reads through.

A family titanpod ships is a module of this package that defines ``SPEC``, a ``ModelSpec``: adding the file adds
the family, and nothing else lists it. Each lookup takes the specs as its last argument (default:
``MODEL_SPECS``), so a family defined elsewhere (in a test, in a user's package) is used by passing
``{**MODEL_SPECS, spec.name: spec}``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from titanpod.models.adapters import DecoderAdapter, StateDictAdapter
from titanpod.models.choice import choose
from titanpod.parallel import ShardingPlan
from titanpod.recipes.families.spec import ModelSpec

if TYPE_CHECKING:
    import torch
    from torch import nn


def shipped_specs() -> dict[str, ModelSpec]:
    """Family name -> spec of every module in this package that defines ``SPEC``, in module name order."""
    package = __name__.rpartition(".")[0]
    specs: dict[str, ModelSpec] = {}
    for module in sorted(info.name for info in pkgutil.iter_modules(importlib.import_module(package).__path__)):
        spec = getattr(importlib.import_module(f"{package}.{module}"), "SPEC", None)
        if isinstance(spec, ModelSpec):
            specs[spec.name] = spec
    return specs


MODEL_SPECS: Mapping[str, ModelSpec] = MappingProxyType(shipped_specs())
"""Family name -> spec, for every family titanpod ships."""


def model_spec(family: str, specs: Mapping[str, ModelSpec] = MODEL_SPECS) -> ModelSpec:
    """The spec of ``family``; ``KeyError`` lists the families and names the closest."""
    return choose("model family", family, specs)


def get_flavor(family: str, flavor: str, specs: Mapping[str, ModelSpec] = MODEL_SPECS) -> Any:
    """The args of ``family``'s ``flavor``; ``KeyError`` names the closest match."""
    return model_spec(family, specs).flavor(flavor)


def build_model(
    family: str,
    flavor: str | Any,
    ops: Any = None,
    device: torch.device | str = "meta",
    specs: Mapping[str, ModelSpec] = MODEL_SPECS,
) -> nn.Module:
    """Build ``family`` at a named ``flavor`` (or explicit args) with the given slot ops, uninitialised.

    On the meta device (the default) nothing is allocated; move with ``model.to_empty(device=...)`` and call
    ``model.init_weights(seed)``.
    """
    import torch  # here, not at the top: the command line reads the recipes without torch

    spec = model_spec(family, specs)
    args = spec.flavor(flavor) if isinstance(flavor, str) else flavor
    with torch.device(device):
        return spec.build(args, ops)


def sharding_plan(family: str, specs: Mapping[str, ModelSpec] = MODEL_SPECS) -> ShardingPlan:
    """``family``'s sharding plan."""
    return model_spec(family, specs).plan


def hf_adapter(family: str, specs: Mapping[str, ModelSpec] = MODEL_SPECS) -> StateDictAdapter:
    """``family``'s Hugging Face adapter; ``ValueError`` when the family has none."""
    adapter = model_spec(family, specs).hf_adapter
    if adapter is None:
        raise ValueError(f"Model family {family!r} has no Hugging Face form: it is saved as model.safetensors only.")
    return adapter


def decoder_adapters(specs: Mapping[str, ModelSpec] = MODEL_SPECS) -> dict[str, DecoderAdapter]:
    """Family -> Hugging Face adapter of every decoder family: what a transformers config.json is read as."""
    return {name: spec.hf_adapter for name, spec in specs.items() if isinstance(spec.hf_adapter, DecoderAdapter)}


def named_recipes(kind: str = "pretrain", specs: Mapping[str, ModelSpec] = MODEL_SPECS) -> dict[str, Callable[[], Any]]:
    """Recipe name -> recipe function, over the recipes of every family whose ``recipe_kind`` is ``kind``, in family
    order."""
    return {
        name: recipe for spec in specs.values() if spec.recipe_kind == kind for name, recipe in spec.recipes.items()
    }
