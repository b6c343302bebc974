"""Tiny random transformers models of each family, saved as sharded Hugging Face checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 2048  # the built-in tokenizer fits, so tests feed real token ids


def hf_model(family: str, seed: int = 0):
    """A randomly initialised transformers model of ``family`` with a few layers."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    torch.manual_seed(seed)
    common = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    if family == "llama3":
        scaling = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,  # short, so test sequences cross every band
        }
        config = LlamaConfig(
            **common,
            intermediate_size=96,
            num_key_value_heads=2,
            rope_theta=500000.0,
            rope_scaling=scaling,
            max_position_embeddings=256,
            tie_word_embeddings=False,
        )
        return LlamaForCausalLM(config).eval()
    if family == "qwen3":
        config = Qwen3Config(
            **common,
            intermediate_size=96,
            num_key_value_heads=2,
            head_dim=32,
            tie_word_embeddings=True,
        )
        return Qwen3ForCausalLM(config).eval()
    config = Qwen3MoeConfig(
        **common,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        output_router_logits=True,
    )
    return Qwen3MoeForCausalLM(config).eval()


def save_sharded(model, directory: Path, max_shard_size: str = "100KB") -> Path:
    """``save_pretrained`` with small shards, so every checkpoint has several files and an index."""
    model.save_pretrained(directory, max_shard_size=max_shard_size)
    return directory
