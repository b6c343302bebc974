"""Hugging Face state-dict adapters, one per model family: config.json <-> titanpod args, and
titanpod's tensors <-> the Hugging Face ones.

- ``decoder``: Llama 3, Qwen 3 and Qwen 3 MoE (transformers' LlamaForCausalLM, Qwen3ForCausalLM,
  Qwen3MoeForCausalLM); config translation in ``decoder_config``.
- ``flux_transformer``: the FLUX.1 transformer (diffusers' FluxTransformer2DModel).
- ``flux_autoencoder``: the FLUX.1 autoencoder (diffusers' AutoencoderKL).

Every adapter is a ``StateDictAdapter`` (``base``). Reading and writing files lives in
titanpod.checkpoint; these modules only translate.
"""

from titanpod.models.adapters.base import HFSlot, StateDictAdapter, UnsupportedConfigError
from titanpod.models.adapters.decoder import DecoderAdapter, hf_name_to_slot, hf_tensors
from titanpod.models.adapters.decoder_config import (
    HF_ARCHITECTURES,
    args_from_hf_config,
    family_of_hf_config,
    hf_config_from_args,
)
from titanpod.models.adapters.flux_autoencoder import (
    FLUX_AUTOENCODER_ADAPTER,
    FluxAutoencoderAdapter,
    UnsupportedAutoencoderConfigError,
)
from titanpod.models.adapters.flux_transformer import FLUX_TRANSFORMER_ADAPTER, FluxTransformerAdapter

__all__ = [
    "FLUX_AUTOENCODER_ADAPTER",
    "FLUX_TRANSFORMER_ADAPTER",
    "HF_ARCHITECTURES",
    "DecoderAdapter",
    "FluxAutoencoderAdapter",
    "FluxTransformerAdapter",
    "HFSlot",
    "StateDictAdapter",
    "UnsupportedAutoencoderConfigError",
    "UnsupportedConfigError",
    "args_from_hf_config",
    "family_of_hf_config",
    "hf_config_from_args",
    "hf_name_to_slot",
    "hf_tensors",
]
