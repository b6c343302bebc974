"""``titanpod-posttrain --recipe grpo_... --dry-run``: a GRPO recipe's memory on one device, the trainer's beside
its rollout engine's, from the ``model.init_from`` folder's shape (only its small files are read) and the run's
prompts (drawn and checked as the run draws them: they give the sequence length)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from titanpod.checkpoint.pretrained import open_pretrained
from titanpod.recipes.families import decoder_adapters
from titanpod.recipes.planner.grpo import GRPOPlan, plan_grpo
from titanpod.recipes.posttrain.grpo_recipe import MISSING_INIT_FROM, GRPORecipe
from titanpod.rl.grpo.setup import load_task, load_tokenizer, plan_prompts

MiB = 2**20


def _mib(size: int) -> str:
    return f"{size / MiB:,.2f} MiB"


def grpo_plan_table(plan: GRPOPlan) -> Table:
    """The plan as a table: each part of one device's memory, and the total."""
    mesh = ", ".join(f"{axis} {size}" for axis, size in plan.mesh.items() if size > 1) or "none"
    table = Table(title=f"GRPO memory per device ({plan.devices} device(s); sharded over: {mesh})", show_header=False)
    trainer = plan.trainer
    rows = [
        ("policy parameters", f"{plan.parameters:,}"),
        ("trainer: parameters (fp32, this share)", _mib(trainer.parameters)),
        ("trainer: gradients (fp32)", _mib(trainer.gradients)),
        ("trainer: AdamW moments (fp32)", _mib(trainer.optimizer)),
        ("trainer: activations (one micro-batch)", _mib(trainer.activations)),
        ("trainer: working memory", _mib(trainer.transient)),
        ("KL reference (fp32, this share)", _mib(plan.reference)),
        (f"engine: weights ({plan.inference_dtype}, whole)", _mib(plan.engine_weights)),
        (f"engine: KV cache ({plan.engine_rows} rows x {plan.seq_len} positions)", _mib(plan.engine_kv_cache)),
        ("weight sync: largest weight in flight", _mib(plan.sync_transient)),
        ("total", _mib(plan.total)),
    ]
    for label, value in rows:
        table.add_row(label, value)
    return table


def grpo_dry_run(recipe: GRPORecipe, devices: int, console: Console) -> GRPOPlan:
    """Plan ``recipe`` on ``devices`` devices (one process each) and print the table; ``ValueError`` without
    ``model.init_from`` (the plan needs the policy's shape)."""
    if recipe.model.init_from is None:
        raise ValueError(MISSING_INIT_FROM)
    folder = open_pretrained(recipe.model.init_from, decoder_adapters())
    prompts = plan_prompts(recipe, load_task(recipe.grpo), load_tokenizer(recipe), folder.args)
    plan = plan_grpo(recipe, folder.family, folder.args, devices, prompts.sequence_length)
    console.print(grpo_plan_table(plan))
    return plan
