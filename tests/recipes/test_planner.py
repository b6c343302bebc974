"""The dry-run planner: published parameter totals, memory accounting, advice, and the prediction
against measured peak memory of real CPU training steps."""

import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from titanpod.device import chip_by_name
from titanpod.pretrain.cli import main
from titanpod.recipes import RECIPES, get_recipe
from titanpod.recipes.planner import plan_run
from titanpod.recipes.planner.plan import with_changes
from titanpod.recipes.planner.report import dry_run

PUBLISHED_BILLIONS = {  # the published totals (shared/REFERENCE.md), to the digits published
    "llama3_8b": (8.030, 3),
    "llama3_70b": (70.554, 3),
    "llama3_405b": (405.853, 3),
    "qwen3_8b": (8.191, 3),
    "qwen3_32b": (32.762, 3),
    "qwen3_235b_a22b": (235.09, 2),
}


def quiet_console() -> Console:
    return Console(file=open(os.devnull, "w"), width=200)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_passes_the_dry_run_on_its_target(name, capsys):
    assert main(["--recipe", name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "does not fit" not in out
    plan = dry_run(get_recipe(name), quiet_console())
    if name in PUBLISHED_BILLIONS:
        billions, digits = PUBLISHED_BILLIONS[name]
        assert round(plan.parameters / 1e9, digits) == billions
        assert f"{plan.parameters:,}" in out


def test_moe_plan_counts_active_parameters():
    recipe = get_recipe("qwen3_235b_a22b")
    plan = plan_run(recipe, chip_by_name(recipe.target.chip), recipe.target.chips, 0.4)
    assert round(plan.active_parameters / 1e9, 2) == 22.19  # published: 22.19B active


def test_state_memory_is_each_parameters_share_on_the_mesh():
    recipe = get_recipe("llama3_405b")  # fsdp 64 x tp 8 on 512 chips
    plan = plan_run(recipe, chip_by_name("v5p"), 512, 0.4)
    assert plan.mesh == {"dp_replicate": 1, "fsdp": 64, "ep": 1, "tp": 8}
    dim, layers, vocab = 16384, 126, 128256
    fsdp_only = (2 * layers + 1) * dim + 2 * vocab * dim  # norms, embedding and output have no tp dimension
    expected = (plan.parameters - fsdp_only) / 512 + fsdp_only / 64
    assert plan.memory.parameters == pytest.approx(4 * expected, rel=1e-9)
    assert plan.memory.optimizer == 2 * plan.memory.parameters == 2 * plan.memory.gradients
    assert plan.tokens_per_step == 2 * 8192 * 64


def test_memory_policies_order_activation_memory():
    recipe = get_recipe("llama3_8b")
    chip = chip_by_name("v6e")
    totals = {
        policy: plan_run(with_changes(recipe, train={"memory_policy": policy}), chip, 256, 0.4).memory
        for policy in ("save", "selective", "recompute", "offload")
    }
    assert totals["save"].activations > totals["selective"].activations > totals["recompute"].activations
    assert totals["offload"].activations < totals["recompute"].activations
    assert totals["offload"].host_offload > 0 == totals["recompute"].host_offload


def test_step_time_follows_from_flops_and_the_target_mfu():
    recipe = get_recipe("qwen3_8b")
    plan = plan_run(recipe, chip_by_name("v6e"), 64, 0.5)
    flops = plan.flops_per_token * plan.tokens_per_step
    assert plan.step_seconds == pytest.approx(flops / (64 * 918e12 * 0.5))
    assert plan.step_seconds == pytest.approx(plan_run(recipe, chip_by_name("v6e"), 64, 0.25).step_seconds / 2)


def test_a_plan_that_does_not_fit_says_so_and_suggests_changes_that_do(capsys):
    code = main(["--recipe", "llama3_8b", "--dry-run", "--chips", "16", "--train.memory-policy", "save"])
    out = capsys.readouterr().out
    assert code == 1
    assert "does not fit" in out and "Changes that lower it" in out
    row = next(line for line in out.splitlines() if "--train.memory-policy recompute" in line)
    assert "yes" in row


def test_a_mesh_the_model_cannot_split_is_named(capsys):
    assert main(["--recipe", "llama3_405b", "--dry-run", "--chips", "12"]) == 2  # 12 is not a multiple of tp 8
    assert "does not divide into 12 processes" in capsys.readouterr().err


def test_unknown_chip_suggests_the_closest(capsys):
    assert main(["--recipe", "llama3_8b", "--dry-run", "--chip", "v5q"]) == 2
    assert "Did you mean" in capsys.readouterr().err


@pytest.mark.slow
def test_memory_prediction_is_within_15_percent_of_measured_cpu_runs(repo_root):
    """Each debug recipe (and the recompute policy) trains a few steps in a fresh process; the planner's
    per-device total must be within 15% of how far the peak resident memory rose."""
    cases = ["llama3_debug", "qwen3_debug", "qwen3_moe_debug", "llama3_debug whole_step recompute"]
    args = [sys.executable, str(repo_root / "tools" / "bench" / "planner_memory.py"), "--json", "--steps", "2"]
    for case in cases:
        args += ["--case", case]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["case"] for r in results] == cases
    for result in results:
        assert 0.85 <= result["ratio"] <= 1.15, result
