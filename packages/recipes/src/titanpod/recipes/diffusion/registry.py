"""Named diffusion recipes: one function each, in its family's spec file (``titanpod.recipes.families.flux``),
listed by ``titanpod-diffusion --list-recipes``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from titanpod.models.choice import choose
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.families import named_recipes

DIFFUSION_RECIPES: Mapping[str, Callable[[], DiffusionRecipe]] = MappingProxyType(named_recipes(kind="diffusion"))
"""Every named diffusion recipe: each diffusion family's, as its spec lists them."""

DEFAULT_DIFFUSION_RECIPE = "flux_debug"


def get_diffusion_recipe(name: str) -> DiffusionRecipe:
    """The diffusion recipe called ``name``; ``KeyError`` names the closest one."""
    return choose("diffusion recipe", name, DIFFUSION_RECIPES)()
