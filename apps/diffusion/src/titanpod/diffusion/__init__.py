"""titanpod-diffusion: not available yet."""
