"""Tiny GGUF files written by the tests: a random Llama or Qwen 3 model, quantized as llama.cpp stores one, with the
built-in byte-level tokenizer and a ChatML template in its metadata (what a real GGUF carries)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from titanpod.data.shipped import builtin_tokenizer_path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A ChatML template, as SmolLM2's and Qwen 3's GGUF files state theirs."""
DIM, FFN, LAYERS, HEADS, KV_HEADS = 64, 96, 2, 4, 2


def _tokenizer_fields() -> tuple[list[str], list[int], list[str]]:
    """The built-in tokenizer's tokens (in id order) with ``<|im_start|>`` and ``<|im_end|>`` after them, their
    llama.cpp types (3: control, 1: normal) and its merges."""
    spec = json.loads(builtin_tokenizer_path().read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {added["content"] for added in spec["added_tokens"] if added["special"]}
    tokens += ["<|im_start|>", "<|im_end|>"]
    types = [3 if token in special or token.startswith("<|im_") else 1 for token in tokens]
    merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in spec["model"]["merges"]]
    return tokens, types, merges


def write_gguf(
    path: Path,
    family: str = "llama3",
    *,
    seed: int = 0,
    tokenizer: bool = True,
    architecture: str | None = None,
    weight_type: str = "Q4_1",
    odd_tensor: str | None = None,
) -> Path:
    """Write a tiny random ``family`` (``llama3`` or ``qwen3``) model to ``path`` as GGUF.

    The projections are stored as ``weight_type`` (Q4_1 as SmolLM2's file, Q8_0, F16, ...), the embedding as Q8_0,
    norms as F32; Llama gets its own output matrix (F16), Qwen 3 ties it to the embedding. ``tokenizer=False``
    leaves the tokenizer out; ``architecture`` states another one than the family's; ``odd_tensor`` names a
    projection stored as int32 (a type gguf cannot dequantize)."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    qwen = family == "qwen3"
    arch = architecture or ("qwen3" if qwen else "llama")
    rng = np.random.default_rng(seed)
    tokens, types, merges = _tokenizer_fields()
    head_dim = 32 if qwen else DIM // HEADS
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{family}")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(DIM)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0 if not qwen else 1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(len(tokens))
    if qwen:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    else:
        writer.add_rope_dimension_count(head_dim)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2" if qwen else "llama-bpe")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(len(tokens) - 2)
        writer.add_eos_token_id(len(tokens) - 1)
        writer.add_pad_token_id(1)
        writer.add_add_bos_token(False)
        writer.add_chat_template(CHAT_TEMPLATE)

    def add(name: str, shape: tuple[int, ...], stored: str) -> None:
        values = (rng.standard_normal(shape) * (0.5 if len(shape) == 1 else 0.08)).astype(np.float32)
        if len(shape) == 1:
            values = 1.0 + values
        if name == odd_tensor:
            writer.add_tensor(name, (values * 100).astype(np.int32))
            return
        kind = gguf.GGMLQuantizationType[stored]
        if kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        elif kind == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, values.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quantize(values, kind), raw_dtype=kind)

    q_rows, kv_rows = HEADS * head_dim, KV_HEADS * head_dim
    add("token_embd.weight", (len(tokens), DIM), "Q8_0")
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        add(f"{block}.attn_norm.weight", (DIM,), "F32")
        add(f"{block}.attn_q.weight", (q_rows, DIM), weight_type)
        add(f"{block}.attn_k.weight", (kv_rows, DIM), weight_type)
        add(f"{block}.attn_v.weight", (kv_rows, DIM), weight_type)
        add(f"{block}.attn_output.weight", (DIM, q_rows), weight_type)
        if qwen:
            add(f"{block}.attn_q_norm.weight", (head_dim,), "F32")
            add(f"{block}.attn_k_norm.weight", (head_dim,), "F32")
        add(f"{block}.ffn_norm.weight", (DIM,), "F32")
        add(f"{block}.ffn_gate.weight", (FFN, DIM), weight_type)
        add(f"{block}.ffn_up.weight", (FFN, DIM), weight_type)
        add(f"{block}.ffn_down.weight", (DIM, FFN), weight_type)
    add("output_norm.weight", (DIM,), "F32")
    if not qwen:
        add("output.weight", (len(tokens), DIM), "F16")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
