"""A tiny Llama 3 policy saved as an SFT run leaves its model folder, for GRPO runs that take seconds."""

from __future__ import annotations

from pathlib import Path

from titanpod.checkpoint import save_model
from titanpod.data.sft.tokenizer import load_sft_tokenizer
from titanpod.models import DecoderArgs
from titanpod.recipes.families import build_model

TINY = DecoderArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, ffn_dim=64, max_seq_len=48)
"""Two layers of width 32 over the character tokenizer's 128 ids."""


def write_tiny_policy(folder: Path) -> Path:
    """A titanpod model folder at ``folder`` with random weights (seed 0) and the character tokenizer."""
    model = build_model("llama3", TINY)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    save_model(model, "llama3", folder, {"step": 0}, extra_files=load_sft_tokenizer("chars").files())
    return folder
