"""Hugging Face state-dict adapters: config.json <-> titanpod args, and titanpod's tensors <-> the Hugging
Face ones. Which family uses which adapter is stated in the family's spec (``titanpod.recipes.families``).

- ``decoder``: the decoder LLMs (transformers' LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, or any
  class a ``DecoderHFForm`` describes); config translation in ``decoder_config``.
- ``flux_transformer``: the FLUX.1 transformer (diffusers' FluxTransformer2DModel).
- ``flux_autoencoder``: the FLUX.1 autoencoder (diffusers' AutoencoderKL).

Every adapter is a ``StateDictAdapter`` (``base``). Reading and writing files lives in
titanpod.checkpoint; these modules only translate.
"""

from titanpod.models.adapters.base import HFSlot, StateDictAdapter, UnsupportedConfigError
from titanpod.models.adapters.decoder import DecoderAdapter, adapter_of_hf_config, hf_name_to_slot, hf_tensors
from titanpod.models.adapters.decoder_config import (
    DecoderHFForm,
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
    "DecoderAdapter",
    "DecoderHFForm",
    "FluxAutoencoderAdapter",
    "FluxTransformerAdapter",
    "HFSlot",
    "StateDictAdapter",
    "UnsupportedAutoencoderConfigError",
    "UnsupportedConfigError",
    "adapter_of_hf_config",
    "args_from_hf_config",
    "family_of_hf_config",
    "hf_config_from_args",
    "hf_name_to_slot",
    "hf_tensors",
]
