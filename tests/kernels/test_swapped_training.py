"""Training with every kernel swapped in follows the run with the PyTorch references.

Llama 3 takes Splash attention and the Pallas loss; Qwen 3 MoE takes Splash, the chunked
loss and the grouped matmul.

fp32, 6 steps of the debug models on the built-in corpus (one 128-token sequence a step): per-step losses agree within
1e-4 relative (the kernels sum in other orders, and AdamW carries that forward).
"""

from __future__ import annotations

import pytest
import torch

from titanpod.data import PackedBatches, builtin_corpus_path, builtin_tokenizer_path, load_tokenizer
from titanpod.data.packing import pack_documents
from titanpod.data.tokenizer import end_of_text_id
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.kernels import GroupedMatmulConfig, KernelConfig, PallasLossConfig, SplashConfig, model_ops
from titanpod.recipes.families import build_model

SWAPS = {
    "llama3": KernelConfig(
        attention="splash",
        head_loss="pallas",
        splash=SplashConfig(block_q=128, block_kv=128),
        pallas_loss=PallasLossConfig(block_rows=64, block_vocab=512),
    ),
    "qwen3_moe": KernelConfig(
        attention="splash",
        head_loss="chunked",
        expert_matmul="gmm",
        chunk_rows=100,
        splash=SplashConfig(block_q=128, block_kv=128),
        grouped_matmul=GroupedMatmulConfig(tile_rows=128, tile_in=128, tile_out=128),
    ),
}


def losses(family: str, kernels: KernelConfig) -> list[float]:
    tokenizer = load_tokenizer(builtin_tokenizer_path())
    documents = builtin_corpus_path().read_text(encoding="utf-8").split("\n\n")[:100]
    tokens = pack_documents(documents, tokenizer, end_of_text_id(tokenizer))
    model = build_model(family, "debug", model_ops(kernels), device="cpu")
    model.init_weights(0)
    config = TrainConfig(steps=6, lr=3e-3, warmup_steps=1, log_every=6)
    summary = train(model, PackedBatches(tokens, 128, 1, seed=0), config, get_backend("cpu"), flops_per_token=1.0)
    return summary.losses


@pytest.mark.parametrize("family", ["llama3", "qwen3_moe"])
def test_all_swaps_follow_the_references(family):
    torch.manual_seed(0)
    reference = losses(family, KernelConfig())
    swapped = losses(family, SWAPS[family])
    assert reference[-1] < reference[0]
    for step, (got, want) in enumerate(zip(swapped, reference, strict=True), 1):
        assert abs(got - want) <= 1e-4 * want, f"step {step}: {got} vs {want}"
