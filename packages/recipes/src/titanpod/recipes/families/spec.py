"""What titanpod knows of one model family, in one value: ``ModelSpec``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from titanpod.models.adapters import StateDictAdapter
from titanpod.models.choice import choose
from titanpod.parallel import ShardingPlan

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """One model family: its shapes, how to build it, how to shard it, its Hugging Face form and its recipes.

    Every registry titanpod has of families (the flavors, the plans, the Hugging Face adapters, the named
    recipes, what the rollout engine serves) is read from these specs; see ``titanpod.recipes.families``.
    """

    name: str
    """Family name, as recipes (``model.family``), ``model.json`` and the model card give it, e.g. ``llama3``."""
    flavors: Mapping[str, Any]
    """Flavor name -> the model's args (``DecoderArgs`` for the decoders), e.g. ``debug`` .. ``405B``."""
    build: Callable[[Any, Any], nn.Module]
    """``build(args, ops)`` -> the model, its parameters on the current default device (``ops`` may be ``None``:
    the reference slot ops)."""
    plan: ShardingPlan
    """Where each parameter goes on the mesh axes."""
    hf_adapter: StateDictAdapter | None = None
    """config.json and tensor names in Hugging Face's form, both ways; ``None`` when the family has none."""
    recipes: Mapping[str, Callable[[], Any]] = field(default_factory=dict)
    """Named recipes that train this family (name -> a function returning the recipe)."""
    recipe_kind: str = "pretrain"
    """What ``recipes`` are and which app runs them: ``pretrain`` (``Recipe``, ``titanpod-pretrain``) or
    ``diffusion`` (``DiffusionRecipe``, ``titanpod-diffusion``)."""
    vllm: bool = False
    """vLLM serves the Hugging Face class of ``hf_adapter``: rollouts may run there (``rollout.mode vllm``)."""

    def flavor(self, name: str) -> Any:
        """The args of flavor ``name``; ``KeyError`` lists the flavors and names the closest."""
        return choose(f"{self.name} flavor", name, self.flavors)


@dataclass(frozen=True)
class ModelClass:
    """A model class named by its module, imported when the first model is built: a family's spec (and so every
    named recipe) is read without torch, as the command line reads them. Called as ``ModelSpec.build`` is."""

    module: str
    """The module defining the class, e.g. ``titanpod.models.common.transformer``."""
    name: str
    """The class, e.g. ``Transformer``."""

    def __call__(self, args: Any, ops: Any) -> nn.Module:
        """``module.name(args, ops)``: the model, on the current default device."""
        return getattr(importlib.import_module(self.module), self.name)(args, ops)
