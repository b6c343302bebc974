"""Scaling a pod recipe for its rehearsal: every setting kept or shown changed, the family's features kept."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import datasets
import pytest

from titanpod.graph import ProfileConfig
from titanpod.parallel import ParallelConfig
from titanpod.recipes import RECIPES, get_recipe
from titanpod.recipes.families import build_model
from titanpod.recipes.rehearsal import RehearsalError, rehearsal_lanes, scale_recipe
from titanpod.recipes.rehearsal.corpus import write_hub_layout
from titanpod.recipes.rehearsal.scaling import (
    GMM_TILE,
    STEPS,
    STOP_AT,
    TORCH_PROCESSES,
    XLA_DEVICES,
    check_honourable,
)
from titanpod.runs.rehearsal.rehearse import LaneResult, judge, judge_without_pp, without_pipeline

POD_RECIPES = [name for name in RECIPES if not name.endswith("_debug")]


def scaled(name: str, lane: str = "cpu", tmp: Path = Path("/nonexistent")):
    return scale_recipe(get_recipe(name), lane, tmp / "runs", tmp / "dataset", tmp / "tokenizer.json")


def test_the_pod_and_single_chip_recipes_are_rehearsed():
    assert sorted(POD_RECIPES) == sorted(
        ["llama32_1b", "llama3_8b", "llama3_70b", "llama3_405b", "llama3_405b_pp", "qwen3_06b", "qwen3_8b",
         "qwen3_32b", "qwen3_235b_a22b"]
    )  # fmt: skip


def test_a_pipelined_recipe_is_rehearsed_with_its_stages_on_the_cpu_lane_only():
    recipe = get_recipe("llama3_405b_pp")
    assert rehearsal_lanes(recipe) == ("cpu",)
    with pytest.raises(RehearsalError, match="torch executor only"):
        check_honourable(recipe, ("cpu", "xla"))
    small, rows = scaled("llama3_405b_pp")
    assert small.parallel.mesh_axes(TORCH_PROCESSES) == {
        "pp": 2, "dp_replicate": 1, "fsdp": 1, "cp": 1, "ep": 1, "tp": 2,
    }  # fmt: skip
    assert small.model.args().n_layers % 2 == 0
    assert small.train.grad_accum_steps == recipe.train.grad_accum_steps == small.parallel.pp_microbatches
    assert any(row.name == "parallel.pp" and row.rehearsal.startswith("2 ") for row in rows)
    interleaved = dataclasses.replace(
        recipe, parallel=dataclasses.replace(recipe.parallel, pp_schedule="interleaved_1f1b", pp_stages_per_rank=3)
    )
    small = scale_recipe(interleaved, "cpu", Path("/x/runs"), Path("/x/dataset"), Path("/x/tokenizer.json"))[0]
    assert small.model.args().n_layers == 6  # one layer for each of pp 2 x 3 stages


@pytest.mark.parametrize("name", POD_RECIPES)
@pytest.mark.parametrize("lane", ["cpu", "xla"])
def test_small_model_keeps_the_family_features(name, lane):
    recipe = get_recipe(name)
    small, _ = scaled(name, lane)
    full, tiny = recipe.model.args(), small.model.args()
    assert tiny.n_heads // tiny.n_kv_heads == full.n_heads // full.n_kv_heads  # GQA ratio
    assert (tiny.qk_norm, tiny.tie_embeddings, tiny.rope_theta, tiny.rope_scaling, tiny.norm_eps) == (
        full.qk_norm, full.tie_embeddings, full.rope_theta, full.rope_scaling, full.norm_eps,
    )  # fmt: skip
    apart = lambda a: a.head_dim is not None and a.head_dim * a.n_heads != a.dim  # noqa: E731
    assert apart(tiny) == apart(full)
    axes = small.parallel.mesh_axes(TORCH_PROCESSES if lane == "cpu" else XLA_DEVICES)
    assert tiny.n_kv_heads % axes["tp"] == 0
    if full.moe is not None:
        assert tiny.moe.top_k == full.moe.top_k
        assert tiny.moe.n_experts % axes["ep"] == 0 and tiny.moe.n_experts > tiny.moe.top_k
        assert tiny.moe.norm_topk_prob == full.moe.norm_topk_prob
    params = sum(p.numel() for p in build_model(small.model.family, tiny).parameters())
    assert params < 20_000_000


@pytest.mark.parametrize("name", POD_RECIPES)
def test_every_setting_is_kept_or_listed_with_its_rehearsal_value(name):
    recipe = get_recipe(name)
    small, rows = scaled(name)
    by_name = {row.name: row for row in rows}
    # the run itself: step mode, memory policy, precision, kernels and optimizer exactly as written
    for path in ("train.step_mode", "train.memory_policy", "train.precision", "train.compiler", "train.lr",
                 "train.weight_decay", "train.grad_clip", "kernels.attention", "kernels.head_loss",
                 "kernels.expert_matmul", "parallel.param_dtype", "parallel.reduce_dtype",
                 "checkpoint.async_save", "data.source", "data.name"):  # fmt: skip
        section, field = path.split(".")
        assert getattr(getattr(small, section), field) == getattr(getattr(recipe, section), field), path
        assert path in by_name
    assert by_name["kernels.attention"].rehearsal == "splash (Pallas interpret mode)"
    tiles = small.kernels.grouped_matmul  # the small model's expert buffers are a few rows: tiles of 128 at most
    assert max(tiles.tile_rows, tiles.tile_in, tiles.tile_out) <= GMM_TILE == 128
    assert small.train.steps == STEPS and small.checkpoint.every == STOP_AT
    leaves = _leaf_paths(recipe.to_dict())
    shown = set(by_name)
    missing = [p for p in leaves if p not in shown and not p.startswith(("model.shape.", "output."))]
    assert not missing, f"settings without a row: {missing}"
    changed = {row.name for row in rows if not row.kept}
    assert {"model.dim", "model.n_layers", "data.seq_len", "train.steps", "data.path", "data.tokenizer"} <= changed


def _leaf_paths(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _leaf_paths(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_parallel_axes_scale_to_the_rehearsal_machine():
    for name, cpu, xla in [
        ("llama3_8b", {"fsdp": 4}, {"fsdp": 8}),
        ("llama3_405b", {"fsdp": 2, "tp": 2}, {"fsdp": 4, "tp": 2}),
        ("qwen3_235b_a22b", {"fsdp": 2, "ep": 2}, {"fsdp": 4, "ep": 2}),
    ]:
        for lane, want, devices in (("cpu", cpu, TORCH_PROCESSES), ("xla", xla, XLA_DEVICES)):
            small, _ = scaled(name, lane)
            axes = {k: v for k, v in small.parallel.mesh_axes(devices).items() if v > 1}
            assert axes == want, (name, lane)
            assert small.device.lane == lane


def test_lanes_and_settings_the_machine_cannot_honour_are_named():
    recipe = get_recipe("llama3_8b")
    assert rehearsal_lanes(recipe) == ("cpu", "xla")
    assert rehearsal_lanes(dataclasses.replace(recipe, device=dataclasses.replace(recipe.device, lane="xla"))) == (
        "xla",
    )
    with pytest.raises(RehearsalError, match=r"device\.lane 'cuda'"):
        rehearsal_lanes(dataclasses.replace(recipe, device=dataclasses.replace(recipe.device, lane="cuda")))
    offload = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, memory_policy="offload"))
    with pytest.raises(RehearsalError, match="memory_policy 'offload'"):
        check_honourable(offload, ("cpu", "xla"))
    check_honourable(offload, ("cpu",))
    shuffled = dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, shuffle_buffer=100))
    with pytest.raises(RehearsalError, match="shuffle_buffer"):
        check_honourable(shuffled, ("cpu",))
    moe_tp = get_recipe("qwen3_235b_a22b")
    moe_tp = dataclasses.replace(moe_tp, parallel=ParallelConfig(tp=2, ep=1))
    with pytest.raises(RehearsalError, match=r"parallel\.tp"):
        check_honourable(moe_tp, ("cpu",))


def test_the_local_dataset_streams_like_the_hub_one(tmp_path):
    recipe = get_recipe("llama3_8b")
    folder = write_hub_layout(tmp_path / "c4", recipe.data.name, recipe.data.split, recipe.data.validation_split)
    train = datasets.load_dataset(str(folder), recipe.data.name, split="train", streaming=True)
    held_out = datasets.load_dataset(str(folder), recipe.data.name, split="validation", streaming=True)
    assert train.n_shards == 8
    train_texts = {row["text"] for row in train}
    held_texts = {row["text"] for row in held_out}
    assert len(train_texts) > 10 * len(held_texts) > 0
    assert not train_texts & held_texts


def _result(reference, resumed, tmp_path):
    result = LaneResult("cpu")
    judge(result, dict(enumerate(reference, 1)), dict(enumerate(resumed, 1)), (tmp_path / "a", tmp_path / "b"))
    return result


def test_judge_names_every_failed_check(tmp_path):
    good = [7.0, 6.9, 6.8, 6.7, 6.6, 6.5]
    ok = _result(good, good, tmp_path)
    assert ok.resume_difference == 0
    assert ok.problems == ["a run wrote no final weights"]  # no model files in tmp_path
    off = _result(good, [*good[:3], 6.7, 6.61, 6.5], tmp_path)
    assert any("resumed steps' losses differ" in p for p in off.problems)
    assert math.isclose(off.resume_difference, 0.01 / 6.6, rel_tol=1e-9)
    flat = _result([7.0] * 6, [7.0] * 6, tmp_path)
    assert any("did not fall" in p for p in flat.problems)
    nan = _result([*good[:5], math.nan], good, tmp_path)
    assert any("not finite" in p for p in nan.problems)
    short = _result(good[:4], good, tmp_path)
    assert short.problems == ["no loss recorded at steps [5, 6]"]


def test_a_rehearsal_neither_profiles_nor_logs_to_wandb(tmp_path):
    recipe = get_recipe("llama3_8b")
    recipe = dataclasses.replace(
        recipe, profile=ProfileConfig("500-502"), output=dataclasses.replace(recipe.output, wandb="project")
    )
    small, rows = scale_recipe(recipe, "cpu", tmp_path / "runs", tmp_path / "dataset", tmp_path / "tokenizer.json")
    assert small.profile.steps is None and small.output.wandb is None
    row = next(row for row in rows if row.name == "profile.steps")
    assert row.recipe == "500-502" and not row.kept


def test_a_pipelined_rehearsal_is_held_to_the_same_recipe_without_stages():
    pipelined = scale_recipe(get_recipe("llama3_405b_pp"), "cpu", Path("runs"), Path("data"), Path("tok"))[0]
    flat = without_pipeline(pipelined)
    assert flat.parallel.pp == 1 and not flat.parallel.pp_recompute
    assert dataclasses.replace(flat, parallel=pipelined.parallel) == pipelined  # nothing else changes
    losses = dict(enumerate([7.0, 6.9, 6.8, 6.7, 6.6, 6.5], 1))
    same = LaneResult("cpu")
    judge_without_pp(same, losses, dict(losses))
    assert same.without_pp_difference == 0 and same.problems == []
    apart = LaneResult("cpu")
    judge_without_pp(apart, losses, {**losses, 4: 6.71})
    assert math.isclose(apart.without_pp_difference, 0.01 / 6.71, rel_tol=1e-9)
    assert any("without pipeline stages by" in problem for problem in apart.problems)
