"""``kernels.attention math`` keeps its fp32 score matrices for the backward where a flash kernel keeps one row
statistic: the dry run counts them, so a run that would not fit is refused before it is built."""

from __future__ import annotations

from titanpod.device import chip_by_name
from titanpod.recipes import get_recipe
from titanpod.recipes.planner import plan_run
from titanpod.recipes.planner.plan import with_changes


def test_the_plan_counts_the_score_matrices_math_attention_keeps():
    recipe = with_changes(get_recipe("llama3_debug"), device={"lane": "cpu"}, train={"memory_policy": "save"})
    chip = chip_by_name("v5e")
    flash, math = (
        plan_run(with_changes(recipe, kernels={"attention": attention}), chip, 1, 0.4) for attention in ("sdpa", "math")
    )
    args, data = recipe.model.args(), recipe.data
    scores = data.batch_size * args.n_heads * data.seq_len**2 * 4  # one block's [B, H, S, S] fp32 softmax input
    kept = math.memory.activations - flash.memory.activations
    assert kept >= args.n_layers * scores  # every block keeps at least its scores (save: nothing recomputed)
    assert math.memory.total > flash.memory.total
    assert math.memory.parameters == flash.memory.parameters and math.memory.optimizer == flash.memory.optimizer
