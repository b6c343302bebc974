"""FLUX.1 (diffusers' ``FluxTransformer2DModel``): the spec of its transformer, the part that trains.

The autoencoder and text encoders it runs with are frozen components of a diffusion run
(``titanpod.runs.diffusion``); its named recipes are diffusion recipes (``titanpod.recipes.diffusion``).
"""

from __future__ import annotations

from titanpod.models import FLUX_FLAVORS, FluxTransformer
from titanpod.models.adapters import FLUX_TRANSFORMER_ADAPTER
from titanpod.parallel import FLUX_PLAN
from titanpod.recipes.families.spec import ModelSpec

SPEC = ModelSpec(
    name="flux",
    flavors=FLUX_FLAVORS,
    build=FluxTransformer,
    plan=FLUX_PLAN,
    hf_adapter=FLUX_TRANSFORMER_ADAPTER,
)
"""The FLUX.1 transformer."""
