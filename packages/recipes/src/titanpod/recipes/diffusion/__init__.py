"""Diffusion (FLUX.1) recipes: typed recipes, and their registry (run by ``titanpod.runs.diffusion``)."""

from titanpod.recipes.diffusion.recipe import DiffusionRecipe, FluxModelConfig, SampleConfig
from titanpod.recipes.diffusion.registry import (
    DEFAULT_DIFFUSION_RECIPE,
    DIFFUSION_RECIPES,
    get_diffusion_recipe,
)

__all__ = [
    "DEFAULT_DIFFUSION_RECIPE",
    "DIFFUSION_RECIPES",
    "DiffusionRecipe",
    "FluxModelConfig",
    "SampleConfig",
    "get_diffusion_recipe",
]
