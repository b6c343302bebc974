"""Named Qwen 3 MoE sizes; the shapes of the public Hugging Face config.json files."""

from __future__ import annotations

from titanpod.models.common.args import DecoderArgs, MoEArgs


def _qwen3_moe(dim: int, n_layers: int, n_heads: int, dense_ffn: int, expert_ffn: int) -> DecoderArgs:
    return DecoderArgs(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=4,
        vocab_size=151936,
        ffn_dim=dense_ffn,
        head_dim=128,
        norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_seq_len=40960,
        qk_norm=True,
        moe=MoEArgs(n_experts=128, top_k=8, expert_ffn_dim=expert_ffn, norm_topk_prob=True, aux_loss_coef=0.001),
    )


QWEN3_MOE_FLAVORS: dict[str, DecoderArgs] = {
    "debug": DecoderArgs(
        dim=256,
        n_layers=4,
        n_heads=8,
        n_kv_heads=4,
        vocab_size=2048,
        ffn_dim=512,
        head_dim=32,
        norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_seq_len=512,
        qk_norm=True,
        moe=MoEArgs(n_experts=8, top_k=2, expert_ffn_dim=128, norm_topk_prob=True, aux_loss_coef=0.001),
    ),
    "30B-A3B": _qwen3_moe(2048, 48, 32, dense_ffn=6144, expert_ffn=768),
    "235B-A22B": _qwen3_moe(4096, 94, 64, dense_ffn=12288, expert_ffn=1536),
}
"""Flavor name -> shape. ``ffn_dim`` is the config's dense width, unused: every layer is sparse."""
