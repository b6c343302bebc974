"""Diffusion (FLUX.1) recipes: the typed recipe (run by ``titanpod.runs.diffusion``); the named ones are listed by
``titanpod.recipes.diffusion.registry``."""

from titanpod.recipes.diffusion.recipe import DiffusionRecipe, FluxModelConfig, SampleConfig

__all__ = [
    "DiffusionRecipe",
    "FluxModelConfig",
    "SampleConfig",
]
