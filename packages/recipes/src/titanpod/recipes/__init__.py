"""titanpod.recipes: named, typed recipes, their registry, the model families (``titanpod.recipes.families``: one
spec per family), the dry-run planner and rehearsal scaling."""

from titanpod.recipes.families.llama3 import llama3_debug
from titanpod.recipes.recipe import ModelConfig, OutputConfig, Recipe
from titanpod.recipes.registry import DEFAULT_RECIPE, RECIPES, get_recipe

__all__ = [
    "DEFAULT_RECIPE",
    "RECIPES",
    "ModelConfig",
    "OutputConfig",
    "Recipe",
    "get_recipe",
    "llama3_debug",
]
