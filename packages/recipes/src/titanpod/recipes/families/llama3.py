"""Llama 3 / 3.1 / 3.2 (transformers' ``LlamaForCausalLM``): the spec and its named recipes."""

from __future__ import annotations

import dataclasses

from titanpod.models.adapters import DecoderAdapter, DecoderHFForm
from titanpod.models.llama3 import LLAMA3_FLAVORS
from titanpod.parallel import DECODER_PLAN, ParallelConfig
from titanpod.recipes.families.spec import ModelClass, ModelSpec
from titanpod.recipes.recipe import DeviceConfig, Recipe, TargetConfig
from titanpod.recipes.recipe_templates import debug_recipe, pod_recipe

HF_FORM = DecoderHFForm("LlamaForCausalLM", "llama", extra_config=(("mlp_bias", False),))
"""Llama's Hugging Face class; its published config.json states ``mlp_bias``."""


def llama3_debug() -> Recipe:
    """Llama 3 debug model (6 layers, dim 256) on the built-in corpus: 100 steps, minutes on a CPU."""
    return debug_recipe("llama3_debug", "llama3")


def llama3_8b() -> Recipe:
    """Llama 3.1 8B on a TPU v6e-256: FSDP, recomputed blocks, 8K sequences, Pallas kernels; on the xla lane its
    32 blocks run as one loop (``train.scan_layers``), so ``--compile-for target`` compiles the full depth
    (its memory and estimated step: docs/recipes.md)."""
    return pod_recipe(
        "llama3_8b", "llama3", "8B", TargetConfig(chip="v6e", chips=256),
        tokenizer="meta-llama/Llama-3.1-8B", seq_len=8192, batch_size=2, lr=3e-4, steps=10_000, warmup_steps=500,
        scan_layers=True,
    )  # fmt: skip


def llama32_1b() -> Recipe:
    """Llama 3.2 1B on one TPU v5e chip (16 GiB; a v5litepod-1, or a v6e-1): 2 x 4,096 tokens a step, recomputed
    blocks run as one loop, Pallas kernels, AdamW's moments in host memory (``train.optimizer_offload``: with them
    on the chip the step does not fit), on the xla lane, which alone keeps them there. On more chips the same recipe
    shards by FSDP over them all. Measured on the chip: docs/tpu-chip.md."""
    recipe = pod_recipe(
        "llama32_1b", "llama3", "1B", TargetConfig(chip="v5e", chips=1),
        tokenizer="meta-llama/Llama-3.2-1B", seq_len=4096, batch_size=2, lr=3e-4, steps=2_000,
        warmup_steps=100, scan_layers=True,
    )  # fmt: skip
    # The moments wait in host memory only inside the xla lane's one JAX program.
    train = dataclasses.replace(recipe.train, optimizer_offload=True)
    return dataclasses.replace(recipe, device=DeviceConfig(lane="xla"), train=train)


def llama3_70b() -> Recipe:
    """Llama 3.1 70B on a TPU v5p-512 (256 chips): FSDP, recomputed blocks, 8K sequences, Pallas kernels; on the
    xla lane its 80 blocks run as one loop (``train.scan_layers``), so the step compiles in minutes."""
    return pod_recipe(
        "llama3_70b", "llama3", "70B", TargetConfig(chip="v5p", chips=256),
        tokenizer="meta-llama/Llama-3.1-70B", seq_len=8192, batch_size=2, lr=1.5e-4, steps=10_000, warmup_steps=1000,
        scan_layers=True,
    )  # fmt: skip


def llama3_405b() -> Recipe:
    """Llama 3.1 405B on a TPU v5p-1024 (512 chips): FSDP 64 x TP 8 with sequence parallelism, recomputed
    blocks, 8K sequences; on the xla lane its 126 blocks run as one loop (``train.scan_layers``)."""
    return pod_recipe(
        "llama3_405b", "llama3", "405B", TargetConfig(chip="v5p", chips=512),
        parallel=ParallelConfig(fsdp=-1, tp=8, param_dtype="bfloat16", reduce_dtype="float32"),
        tokenizer="meta-llama/Llama-3.1-405B", seq_len=8192, batch_size=2, lr=8e-5, steps=10_000, warmup_steps=2000,
        scan_layers=True,
    )  # fmt: skip


def llama3_405b_pp() -> Recipe:
    """Llama 3.1 405B over two TPU v5p-1024 slices (1024 chips): pipeline stages across the slices (pp 2, 1F1B,
    8 micro-batches of one 8K sequence a data rank), FSDP 64 x TP 8 within each. Only activations cross
    between slices. Eager steps (a pipeline does not run as one captured step) with each layer recomputed in
    its backward (``parallel.pp_recompute``); no validation (a pipeline rank holds half the model)."""
    base = llama3_405b()
    return dataclasses.replace(
        base,
        name="llama3_405b_pp",
        target=TargetConfig(chip="v5p", chips=1024),
        parallel=dataclasses.replace(base.parallel, pp=2, pp_schedule="1f1b", pp_microbatches=8, pp_recompute=True),
        data=dataclasses.replace(base.data, batch_size=1, validation_split=None, validation_every=0),
        train=dataclasses.replace(
            base.train, grad_accum_steps=8, step_mode="eager", memory_policy="save", scan_layers=False
        ),
    )


SPEC = ModelSpec(
    name="llama3",
    flavors=LLAMA3_FLAVORS,
    build=ModelClass("titanpod.models.common.transformer", "Transformer"),
    plan=DECODER_PLAN,
    hf_adapter=DecoderAdapter("llama3", HF_FORM),
    recipes={
        recipe.__name__: recipe
        for recipe in (llama3_debug, llama32_1b, llama3_8b, llama3_70b, llama3_405b, llama3_405b_pp)
    },
    vllm=True,
)
"""Llama 3."""
