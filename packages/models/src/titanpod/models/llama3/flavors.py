"""Named Llama 3 sizes; the shapes of the public Hugging Face config.json files."""

from __future__ import annotations

from titanpod.models.common.args import DecoderArgs
from titanpod.models.common.rope_scaling import Llama3RopeScaling

_LLAMA31 = Llama3RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
_LLAMA32 = Llama3RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)


def _llama3(dim: int, n_layers: int, n_heads: int, ffn_dim: int, **extra: object) -> DecoderArgs:
    shape = {"n_kv_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0, "norm_eps": 1e-5, "max_seq_len": 131072}
    shape.update(extra)
    return DecoderArgs(dim=dim, n_layers=n_layers, n_heads=n_heads, ffn_dim=ffn_dim, **shape)  # type: ignore[arg-type]


LLAMA3_FLAVORS: dict[str, DecoderArgs] = {
    # Small enough to train on a laptop CPU in minutes; shapes follow the family.
    "debug": DecoderArgs(dim=256, n_layers=6, n_heads=16, n_kv_heads=4, vocab_size=2048, ffn_dim=768, max_seq_len=512),
    "1B": _llama3(2048, 16, 32, 8192, head_dim=64, tie_embeddings=True, rope_scaling=_LLAMA32),  # Llama 3.2
    "3B": _llama3(3072, 28, 24, 8192, tie_embeddings=True, rope_scaling=_LLAMA32),  # Llama 3.2
    "8B": _llama3(4096, 32, 32, 14336, rope_scaling=_LLAMA31),  # Llama 3.1
    "70B": _llama3(8192, 80, 64, 28672, rope_scaling=_LLAMA31),  # Llama 3.1
    "405B": _llama3(16384, 126, 128, 53248, rope_scaling=_LLAMA31),  # Llama 3.1
}
"""Flavor name -> shape."""
