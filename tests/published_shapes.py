"""Hugging Face checkpoints with the config.json of published models, narrowed to run on a CPU in seconds, each saved
by transformers with random weights and a small tokenizer of the family's kind (special tokens, chat template).

Each published config keeps what decides how the weights are read and how the model computes: the class, the
relation of ``head_dim`` to ``hidden_size / num_attention_heads`` (equal, written out, for Llama 3.1 8B, Llama 3.2
1B and Qwen 3 8B; different for Qwen 3 0.6B and Qwen3-30B-A3B), the grouped-query ratio, RoPE theta and the Llama 3
frequency scaling, tied or untied embeddings, the norm epsilon, the vocabulary size, and for the mixture of experts
its 128 experts, 8 chosen, renormalised. Only widths (hidden, heads, feed-forward) and depth shrink.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

LLAMA31_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
LLAMA32_SCALING = {**LLAMA31_SCALING, "factor": 32.0}
LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a checkpoint is fine-tuned on new data and exported again",
    "models read tokens and predict the next one",
    "reverse: abc -> cba",
]


@dataclass(frozen=True)
class PublishedShape:
    """One published model: its config.json (narrowed as the module docstring says) and its tokenizer's kind."""

    name: str
    """The published model, e.g. ``Llama-3.1-8B``."""
    family: str
    """The titanpod family that reads it."""
    architecture: str
    """transformers' class."""
    config: dict[str, Any]
    """config.json fields, as published except for widths and depth."""
    specials: tuple[str, ...]
    """The tokenizer's special tokens; the first is bos for Llama 3, else the end of text."""
    template: str
    """The chat template."""
    bos: str | None = None
    """The token sequences start with, if any."""
    eos: str = "<|endoftext|>"
    """The end-of-text token."""
    published: dict[str, Any] = field(default_factory=dict)
    """The published sizes that were narrowed (for the record)."""


def _llama(**extra: Any) -> dict[str, Any]:
    return {
        "model_type": "llama", "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "vocab_size": 128256,
        "num_hidden_layers": 2, **extra,
    }  # fmt: skip


def _qwen3(**extra: Any) -> dict[str, Any]:
    return {
        "model_type": "qwen3", "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 151936,
        "num_hidden_layers": 2, **extra,
    }  # fmt: skip


SHAPES = {
    shape.name: shape
    for shape in (
        PublishedShape(
            "Llama-3.1-8B", "llama3", "LlamaForCausalLM",
            _llama(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=16, intermediate_size=224,
                   rope_scaling=LLAMA31_SCALING, tie_word_embeddings=False),
            LLAMA3_SPECIALS, LLAMA3_TEMPLATE, bos="<|begin_of_text|>", eos="<|end_of_text|>",
            published={"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                       "intermediate_size": 14336, "num_hidden_layers": 32},
        ),
        PublishedShape(
            "Llama-3.2-1B", "llama3", "LlamaForCausalLM",
            _llama(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=16, intermediate_size=256,
                   rope_scaling=LLAMA32_SCALING, tie_word_embeddings=True),
            LLAMA3_SPECIALS, LLAMA3_TEMPLATE, bos="<|begin_of_text|>", eos="<|end_of_text|>",
            published={"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                       "intermediate_size": 8192, "num_hidden_layers": 16},
        ),
        PublishedShape(
            "SmolLM2-135M", "llama3", "LlamaForCausalLM",
            _llama(hidden_size=48, num_attention_heads=3, num_key_value_heads=1, head_dim=16, intermediate_size=128,
                   rope_theta=100000.0, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True),
            CHATML_SPECIALS, CHATML_TEMPLATE,
            published={"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                       "intermediate_size": 1536, "num_hidden_layers": 30},
        ),
        PublishedShape(
            "Qwen3-0.6B", "qwen3", "Qwen3ForCausalLM",
            _qwen3(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=192,
                   tie_word_embeddings=True),
            CHATML_SPECIALS, CHATML_TEMPLATE,
            published={"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                       "intermediate_size": 3072, "num_hidden_layers": 28},
        ),
        PublishedShape(
            "Qwen3-8B", "qwen3", "Qwen3ForCausalLM",
            _qwen3(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=16, intermediate_size=192,
                   tie_word_embeddings=False),
            CHATML_SPECIALS, CHATML_TEMPLATE,
            published={"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                       "intermediate_size": 12288, "num_hidden_layers": 36},
        ),
        PublishedShape(
            "Qwen3-30B-A3B", "qwen3_moe", "Qwen3MoeForCausalLM",
            _qwen3(model_type="qwen3_moe", hidden_size=64, num_attention_heads=8, num_key_value_heads=1, head_dim=16,
                   intermediate_size=192, moe_intermediate_size=24, num_experts=128, num_experts_per_tok=8,
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001,
                   tie_word_embeddings=False, num_hidden_layers=1),
            CHATML_SPECIALS, CHATML_TEMPLATE,
            published={"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                       "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48},
        ),
    )
}  # fmt: skip
"""Published model name -> its narrowed shape."""


def small_tokenizer(shape: PublishedShape):
    """A byte-level BPE tokenizer trained here on ``CORPUS`` (a few hundred tokens, the special tokens first), as
    transformers' fast tokenizer with the family's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=list(shape.specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokens = {"eos_token": shape.eos, "chat_template": shape.template}
    if shape.bos is not None:
        tokens["bos_token"] = shape.bos
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **tokens)


def save_published(shape: PublishedShape, folder: Path, seed: int = 0) -> Path:
    """``shape``'s model with random weights and its tokenizer, saved by transformers into ``folder``."""
    import transformers

    tokenizer = small_tokenizer(shape)
    ids = {"eos_token_id": tokenizer.convert_tokens_to_ids(shape.eos)}
    if shape.bos is not None:
        ids["bos_token_id"] = tokenizer.convert_tokens_to_ids(shape.bos)
    kind = getattr(transformers, shape.architecture)
    fields = {key: value for key, value in shape.config.items() if key != "model_type"}  # the class says it
    config = kind.config_class(**fields, **ids)
    torch.manual_seed(seed)
    kind(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
