"""titanpod.models: single-device PyTorch model code, built on the meta device.

A family is a model class, an args dataclass and named flavors. Each model takes a
``ModelOps`` for its swappable slots; the defaults are PyTorch references.
"""

from titanpod.models.common.counting import decoder_flops_per_token, parameter_count
from titanpod.models.common.ops import IGNORE_INDEX, ModelOps, linear_cross_entropy, sdpa_attention
from titanpod.models.registry import FAMILIES, ModelFamily, build_model, get_flavor

__all__ = [
    "FAMILIES",
    "IGNORE_INDEX",
    "ModelFamily",
    "ModelOps",
    "build_model",
    "decoder_flops_per_token",
    "get_flavor",
    "linear_cross_entropy",
    "parameter_count",
    "sdpa_attention",
]
