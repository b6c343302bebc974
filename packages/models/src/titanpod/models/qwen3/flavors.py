"""Named Qwen 3 dense sizes; the shapes of the public Hugging Face config.json files."""

from __future__ import annotations

import dataclasses

from titanpod.models.common.args import DecoderArgs

QWEN3_COMMON = DecoderArgs(
    vocab_size=151936, head_dim=128, norm_eps=1e-6, rope_theta=1_000_000.0, max_seq_len=40960, qk_norm=True
)
"""What every published Qwen 3 model shares (dense and MoE); flavors replace the sizes."""

QWEN3_DEBUG = dataclasses.replace(
    QWEN3_COMMON, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=2048, ffn_dim=512, head_dim=32,
    max_seq_len=512,
)  # fmt: skip
"""A CPU-sized Qwen 3: the family's arithmetic at debug scale."""


def _qwen3(dim: int, n_layers: int, n_heads: int, ffn_dim: int, tied: bool) -> DecoderArgs:
    return dataclasses.replace(
        QWEN3_COMMON, dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=8, ffn_dim=ffn_dim, tie_embeddings=tied
    )


QWEN3_FLAVORS: dict[str, DecoderArgs] = {
    "debug": dataclasses.replace(QWEN3_DEBUG, tie_embeddings=True),
    "0.6B": _qwen3(1024, 28, 16, 3072, tied=True),
    "1.7B": _qwen3(2048, 28, 16, 6144, tied=True),
    "4B": _qwen3(2560, 36, 32, 9728, tied=True),
    "8B": _qwen3(4096, 36, 32, 12288, tied=False),
    "14B": _qwen3(5120, 40, 40, 17408, tied=False),
    "32B": _qwen3(5120, 64, 64, 25600, tied=False),
}
"""Flavor name -> shape."""
