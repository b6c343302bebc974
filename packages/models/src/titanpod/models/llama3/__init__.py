"""Llama 3 / 3.1 / 3.2: GQA, SwiGLU, RMSNorm, RoPE with the Llama 3.1 frequency scaling."""

from titanpod.models.llama3.flavors import LLAMA3_FLAVORS

__all__ = ["LLAMA3_FLAVORS"]
