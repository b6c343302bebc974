"""Qwen 3 dense (transformers' ``Qwen3ForCausalLM``): the spec and its named recipes."""

from __future__ import annotations

from titanpod.models.adapters import DecoderAdapter, DecoderHFForm
from titanpod.models.qwen3 import QWEN3_FLAVORS
from titanpod.parallel import DECODER_PLAN
from titanpod.recipes.families.spec import ModelClass, ModelSpec
from titanpod.recipes.recipe import Recipe, TargetConfig
from titanpod.recipes.recipe_templates import ONE_CHIP_KERNELS, debug_recipe, pod_recipe

HF_FORM = DecoderHFForm("Qwen3ForCausalLM", "qwen3", qk_norm=True, sliding_window=True)
"""Qwen 3's Hugging Face class: per-head query and key norms."""


def qwen3_debug() -> Recipe:
    """Qwen 3 debug model (4 layers, dim 256, q/k norms, tied embeddings) on the built-in corpus."""
    return debug_recipe("qwen3_debug", "qwen3")


def qwen3_8b() -> Recipe:
    """Qwen 3 8B on a TPU v6e-64: FSDP, recomputed blocks, 4K sequences, Pallas kernels; on the xla lane its 36
    blocks run as one loop (``train.scan_layers``). Blocks are recomputed: the selective policy's compile needed
    more of a chip's memory (docs/recipes.md)."""
    return pod_recipe(
        "qwen3_8b", "qwen3", "8B", TargetConfig(chip="v6e", chips=64),
        tokenizer="Qwen/Qwen3-8B", seq_len=4096, batch_size=2, lr=3e-4, steps=10_000, warmup_steps=500,
        scan_layers=True,
    )  # fmt: skip


def qwen3_06b() -> Recipe:
    """Qwen 3 0.6B on one TPU v5e chip (16 GiB; a v5litepod-1, or a v6e-1): 4 x 4,096 tokens a step, recomputed
    blocks run as one loop, Pallas kernels with the tiles measured fastest on the chip. On more chips the same
    recipe shards by FSDP over them all, 4 sequences a chip. Measured on the chip: docs/tpu-chip.md."""
    return pod_recipe(
        "qwen3_06b", "qwen3", "0.6B", TargetConfig(chip="v5e", chips=1),
        tokenizer="Qwen/Qwen3-0.6B", seq_len=4096, batch_size=4, lr=3e-4, steps=2_000,
        warmup_steps=100, scan_layers=True, kernels=ONE_CHIP_KERNELS,
    )  # fmt: skip


def qwen3_32b() -> Recipe:
    """Qwen 3 32B on a TPU v5p-256 (128 chips): FSDP, recomputed blocks, 4K sequences, Pallas kernels; on the
    xla lane its 64 blocks run as one loop (``train.scan_layers``; its full-depth compile: docs/recipes.md)."""
    return pod_recipe(
        "qwen3_32b", "qwen3", "32B", TargetConfig(chip="v5p", chips=128),
        tokenizer="Qwen/Qwen3-32B", seq_len=4096, batch_size=4, lr=2e-4, steps=10_000, warmup_steps=1000,
        scan_layers=True,
    )  # fmt: skip


SPEC = ModelSpec(
    name="qwen3",
    flavors=QWEN3_FLAVORS,
    build=ModelClass("titanpod.models.common.transformer", "Transformer"),
    plan=DECODER_PLAN,
    hf_adapter=DecoderAdapter("qwen3", HF_FORM),
    recipes={recipe.__name__: recipe for recipe in (qwen3_debug, qwen3_06b, qwen3_8b, qwen3_32b)},
    vllm=True,
)
"""Qwen 3 dense."""
