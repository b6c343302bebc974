"""Model families: one ``ModelSpec`` per family, one file each (``llama3``, ``qwen3``, ``qwen3_moe``, ``flux``),
and the lookups (``catalog``) that every registry of families reads. docs/adding-a-model.md walks through
adding one."""

from titanpod.recipes.families.catalog import (
    MODEL_SPECS,
    build_model,
    decoder_adapters,
    get_flavor,
    hf_adapter,
    model_spec,
    named_recipes,
    sharding_plan,
)
from titanpod.recipes.families.spec import ModelSpec

__all__ = [
    "MODEL_SPECS",
    "ModelSpec",
    "build_model",
    "decoder_adapters",
    "get_flavor",
    "hf_adapter",
    "model_spec",
    "named_recipes",
    "sharding_plan",
]
