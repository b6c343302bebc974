"""titanpod-diffusion: train a FLUX.1 diffusion transformer from a recipe, plan it, and sample images from a run."""
