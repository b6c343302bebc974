"""titanpod.recipes: named, typed recipes, their registry, the model families (``titanpod.recipes.families``: one
spec per family), the dry-run planner and rehearsal scaling.

The names below are imported when first used, so a module of this package that needs none of them
(``titanpod.recipes.app``, the commands' entry) is imported without the model code and torch behind them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from titanpod.recipes.families.llama3 import llama3_debug
    from titanpod.recipes.recipe import ModelConfig, OutputConfig, Recipe
    from titanpod.recipes.registry import DEFAULT_RECIPE, RECIPES, get_recipe

_HOMES = {
    "DEFAULT_RECIPE": "titanpod.recipes.registry",
    "RECIPES": "titanpod.recipes.registry",
    "get_recipe": "titanpod.recipes.registry",
    "ModelConfig": "titanpod.recipes.recipe",
    "OutputConfig": "titanpod.recipes.recipe",
    "Recipe": "titanpod.recipes.recipe",
    "llama3_debug": "titanpod.recipes.families.llama3",
}
"""Where each public name lives."""

__all__ = [
    "DEFAULT_RECIPE",
    "RECIPES",
    "ModelConfig",
    "OutputConfig",
    "Recipe",
    "get_recipe",
    "llama3_debug",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'titanpod.recipes' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
