"""Named recipes: one function each, in its family's spec file (``titanpod.recipes.families``), listed by
``titanpod-pretrain --list-recipes``.

The debug recipes train on this machine in minutes. The others describe a production run
on the slice named in their ``target``: ``titanpod-pretrain --recipe NAME --dry-run``
shows what that costs, and the same recipe runs on the pod unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from titanpod.models.choice import choose
from titanpod.recipes.families import named_recipes
from titanpod.recipes.recipe import Recipe

RECIPES: Mapping[str, Callable[[], Recipe]] = MappingProxyType(named_recipes())
"""Every named recipe: each family's, as its spec lists them."""

DEFAULT_RECIPE = "llama3_debug"


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; ``KeyError`` names the closest one."""
    return choose("recipe", name, RECIPES)()
