"""Named Qwen 3 MoE sizes; the shapes of the public Hugging Face config.json files."""

from __future__ import annotations

import dataclasses

from titanpod.models.common.args import DecoderArgs, MoEArgs
from titanpod.models.qwen3.flavors import QWEN3_COMMON, QWEN3_DEBUG


def _qwen3_moe(dim: int, n_layers: int, n_heads: int, dense_ffn: int, expert_ffn: int) -> DecoderArgs:
    moe = MoEArgs(n_experts=128, top_k=8, expert_ffn_dim=expert_ffn, norm_topk_prob=True, aux_loss_coef=0.001)
    return dataclasses.replace(
        QWEN3_COMMON, dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=4, ffn_dim=dense_ffn, moe=moe
    )


QWEN3_MOE_FLAVORS: dict[str, DecoderArgs] = {
    "debug": dataclasses.replace(
        QWEN3_DEBUG, moe=MoEArgs(n_experts=8, top_k=2, expert_ffn_dim=128, norm_topk_prob=True, aux_loss_coef=0.001)
    ),
    "30B-A3B": _qwen3_moe(2048, 48, 32, dense_ffn=6144, expert_ffn=768),
    "235B-A22B": _qwen3_moe(4096, 94, 64, dense_ffn=12288, expert_ffn=1536),
}
"""Flavor name -> shape. ``ffn_dim`` is the config's dense width, unused: every layer is sparse."""
