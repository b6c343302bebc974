"""titanpod.recipes: named, typed recipes, their registry, the dry-run planner and rehearsal scaling."""

from titanpod.recipes.recipe import ModelConfig, OutputConfig, Recipe
from titanpod.recipes.registry import DEFAULT_RECIPE, RECIPES, get_recipe, llama3_debug

__all__ = [
    "DEFAULT_RECIPE",
    "RECIPES",
    "ModelConfig",
    "OutputConfig",
    "Recipe",
    "get_recipe",
    "llama3_debug",
]
