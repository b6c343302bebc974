"""Qwen 3 MoE (transformers' ``Qwen3MoeForCausalLM``): the spec and its named recipes."""

from __future__ import annotations

from titanpod.models.adapters import DecoderAdapter, DecoderHFForm
from titanpod.models.qwen3_moe import QWEN3_MOE_FLAVORS
from titanpod.parallel import DECODER_PLAN, ParallelConfig
from titanpod.recipes.families.spec import ModelClass, ModelSpec
from titanpod.recipes.recipe import Recipe, TargetConfig
from titanpod.recipes.recipe_templates import debug_recipe, pod_recipe

HF_FORM = DecoderHFForm("Qwen3MoeForCausalLM", "qwen3_moe", qk_norm=True, moe=True, sliding_window=True)
"""Qwen 3 MoE's Hugging Face class: per-head query and key norms, routed experts in every layer."""


def qwen3_moe_debug() -> Recipe:
    """Qwen 3 MoE debug model (8 experts, top 2) on the built-in corpus."""
    return debug_recipe("qwen3_moe_debug", "qwen3_moe")


def qwen3_235b_a22b() -> Recipe:
    """Qwen 3 235B-A22B (128 experts, top 8) on a TPU v5p-256 (128 chips): FSDP 16 x EP 8, recomputed blocks,
    4K sequences; on the xla lane its 94 blocks run as one loop (``train.scan_layers``).

    Each expert takes 1.25x its fair share of a batch's routed tokens (choices past that are
    dropped and counted): with static shapes, no capacity limit would give every one of the
    128 experts a buffer of the whole batch, 16x the expert compute and all-to-all traffic. Compiled for its
    slice: docs/recipes.md.
    """
    return pod_recipe(
        "qwen3_235b_a22b", "qwen3_moe", "235B-A22B", TargetConfig(chip="v5p", chips=128),
        parallel=ParallelConfig(fsdp=-1, ep=8, param_dtype="bfloat16", reduce_dtype="float32"),
        capacity_factor=1.25,
        tokenizer="Qwen/Qwen3-235B-A22B", seq_len=4096, batch_size=1, lr=1e-4, steps=10_000, warmup_steps=1000,
        scan_layers=True,
    )  # fmt: skip


SPEC = ModelSpec(
    name="qwen3_moe",
    flavors=QWEN3_MOE_FLAVORS,
    build=ModelClass("titanpod.models.common.transformer", "Transformer"),
    plan=DECODER_PLAN,
    hf_adapter=DecoderAdapter("qwen3_moe", HF_FORM),
    recipes={recipe.__name__: recipe for recipe in (qwen3_moe_debug, qwen3_235b_a22b)},
    vllm=True,
)
"""Qwen 3 MoE."""
