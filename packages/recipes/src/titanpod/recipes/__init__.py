"""titanpod.recipes: named, typed recipes, their data, and building a run from one."""

from titanpod.recipes.recipe import ModelConfig, OutputConfig, Recipe
from titanpod.recipes.registry import DEFAULT_RECIPE, RECIPES, get_recipe, llama3_debug
from titanpod.recipes.run import PretrainResult, run_pretraining

__all__ = [
    "DEFAULT_RECIPE",
    "RECIPES",
    "ModelConfig",
    "OutputConfig",
    "PretrainResult",
    "Recipe",
    "get_recipe",
    "llama3_debug",
    "run_pretraining",
]
