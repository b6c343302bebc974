"""Named Llama 3 sizes."""

from __future__ import annotations

from titanpod.models.llama3.args import Llama3Args

LLAMA3_FLAVORS: dict[str, Llama3Args] = {
    # Small enough to train on a laptop CPU in minutes; shapes follow the family.
    "debug": Llama3Args(dim=256, n_layers=6, n_heads=16, n_kv_heads=4, vocab_size=2048, ffn_dim=768, max_seq_len=512)
}
"""Flavor name -> shape."""
