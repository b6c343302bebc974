"""The GRPO dry run counts the rollout engine's weights (in its inference dtype) and KV cache beside the trainer's
memory; the figures are checked against ones derived by hand from the tiny model's shape."""

from __future__ import annotations

import dataclasses

from tests.rl.test_grpo_run import sft_folder, tiny  # noqa: F401  (sft_folder: a fixture)
from tests.rl.tiny_policy import TINY
from titanpod.parallel import ParallelConfig
from titanpod.posttrain.cli import main
from titanpod.recipes.planner.grpo import plan_grpo
from titanpod.recipes.posttrain.rollout_config import RolloutConfig

# TINY by hand (llama3, untied): embeddings and output 128 x 32 each; per layer wq, wo 32 x 32, wk, wv 32 x 16
# (2 kv heads of 8), w1, w2, w3 32 x 64, two norms of 32; a final norm of 32.
TINY_PARAMETERS = 2 * 128 * 32 + 2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32) + 32
assert TINY_PARAMETERS == 26_784


def test_the_plan_counts_the_engine_weights_in_its_dtype_and_its_kv_cache(tmp_path):
    recipe = dataclasses.replace(
        tiny(tmp_path, None, "plan", prompts_per_step=4, group_size=3, kl_beta=0.1),
        rollout=RolloutConfig(dtype="bfloat16"),
        parallel=ParallelConfig(fsdp=2),
    )
    plan = plan_grpo(recipe, "llama3", TINY, devices=2, seq_len=20)
    assert plan.parameters == TINY_PARAMETERS
    assert plan.engine_weights == TINY_PARAMETERS * 2  # bf16: 53,568 bytes
    # 4 prompts over 2 data ranks x 3 completions = 6 rows; keys and values of 2 layers, 2 kv heads of 8, 20 positions.
    assert plan.engine_rows == 6
    assert plan.engine_kv_cache == 2 * 2 * 6 * 2 * 20 * 8 * 2 == 15_360
    assert plan.sync_transient == 128 * 32 * 2  # the largest weight (embeddings or output) in bf16
    # The trainer holds about half the fp32 policy (fsdp 2), the KL reference as much again.
    assert TINY_PARAMETERS * 4 // 2 <= plan.trainer.parameters < TINY_PARAMETERS * 4
    assert plan.reference == plan.trainer.parameters
    assert plan.total == (plan.trainer.total + plan.reference + TINY_PARAMETERS * 2 + 15_360 + 128 * 32 * 2)
    fp32 = plan_grpo(dataclasses.replace(recipe, rollout=RolloutConfig()), "llama3", TINY, devices=2, seq_len=20)
    assert fp32.engine_weights == TINY_PARAMETERS * 4 and fp32.engine_kv_cache == 2 * 15_360


def test_the_dry_run_prints_the_engine_beside_the_trainer(sft_folder, capsys):  # noqa: F811
    flags = ["--grpo.task", "reverse", "--grpo.max-new-tokens", "4"]  # prompts that fit TINY's 48 positions
    code = main(["--recipe", "grpo_debug", "--model.init-from", str(sft_folder), *flags, "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "engine: weights (float32, whole)" in out and "engine: KV cache" in out and "trainer: parameters" in out
    assert f"{TINY_PARAMETERS:,}" in out


def test_the_dry_run_plans_grpo_recipes_only(capsys):
    assert main(["--recipe", "sft_debug", "--dry-run"]) == 2
    assert "--dry-run plans GRPO recipes" in capsys.readouterr().err
