"""Qwen 3 MoE: Qwen 3 attention with every feed-forward layer a top-k mixture of experts."""

from titanpod.models.qwen3_moe.flavors import QWEN3_MOE_FLAVORS

__all__ = ["QWEN3_MOE_FLAVORS"]
