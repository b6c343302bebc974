"""Qwen 3 dense: explicit head_dim, RMSNorm on query and key heads, no attention bias."""

from titanpod.models.qwen3.flavors import QWEN3_FLAVORS

__all__ = ["QWEN3_FLAVORS"]
