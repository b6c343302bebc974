"""Hugging Face interchange: config.json and tensor names for Llama 3, Qwen 3 and Qwen 3 MoE.

File reading and writing live in titanpod.checkpoint; this package only translates.
"""

from titanpod.models.hf.config import HF_ARCHITECTURES, args_from_hf_config, hf_config_from_args
from titanpod.models.hf.names import HFSlot, hf_name_to_slot, hf_tensors

__all__ = ["HF_ARCHITECTURES", "HFSlot", "args_from_hf_config", "hf_config_from_args", "hf_name_to_slot", "hf_tensors"]
