"""``tools/bench/grpo_vs_trl.py``'s parts that need neither TRL nor a training run: the settings both trainers
get, the learning-rate warmup given to TRL, and the statistics of the table."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from titanpod.recipes.posttrain.registry import grpo_debug

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench" / "grpo_vs_trl.py"


def _bench():
    spec = importlib.util.spec_from_file_location("grpo_vs_trl", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_both_trainers_get_the_recipes_settings():
    bench = _bench()
    recipe = grpo_debug()
    settings = bench.MatchedSettings.from_recipe(recipe)
    kwargs = bench.trl_config_kwargs(settings, seed=3, output_dir="out")
    grpo, train = recipe.grpo, recipe.train
    assert kwargs["max_steps"] == train.steps
    assert kwargs["num_generations"] == grpo.group_size
    # one generation of every prompt's group and one update on all of it per step
    assert kwargs["per_device_train_batch_size"] == grpo.prompts_per_step * grpo.group_size
    assert kwargs["gradient_accumulation_steps"] == 1 and kwargs["num_iterations"] == 1
    assert kwargs["max_completion_length"] == grpo.max_new_tokens
    assert kwargs["temperature"] == grpo.temperature and kwargs["top_p"] == grpo.top_p
    assert kwargs["learning_rate"] == train.lr
    assert (kwargs["adam_beta1"], kwargs["adam_beta2"], kwargs["adam_epsilon"]) == (train.beta1, train.beta2, train.eps)
    assert kwargs["weight_decay"] == train.weight_decay and kwargs["max_grad_norm"] == train.grad_clip
    assert kwargs["epsilon"] == grpo.clip_eps and kwargs["beta"] == grpo.kl_beta
    assert kwargs["seed"] == 3 and kwargs["shuffle_dataset"] is False
    assert kwargs["loss_type"] == "dapo" and kwargs["scale_rewards"] == "group"
    assert kwargs["gradient_checkpointing"] is False  # titanpod keeps activations too


def test_trl_is_given_titanpods_warmup():
    bench = _bench()
    settings = bench.MatchedSettings.from_recipe(grpo_debug())
    assert settings.warmup_steps == 5
    # titanpod's GRPO step s (1-based) runs at s / 5 of the peak; torch's scheduler counts updates from 0
    assert [bench.warmup_factor(settings, i) for i in (0, 1, 4, 5, 50)] == [0.2, 0.4, 1.0, 1.0, 1.0]
    flat = dataclasses.replace(settings, warmup_steps=0)
    assert bench.warmup_factor(flat, 0) == 1.0


@pytest.mark.parametrize(
    "change, named",
    [
        ({"grpo": {"updates_per_step": 2}}, "updates_per_step"),
        ({"train": {"decay": "cosine"}}, "train.decay"),
        ({"grpo": {"reward_function": "m:f"}}, "reward_function"),
    ],
)
def test_a_setting_trl_cannot_match_is_refused_by_name(change, named):
    bench = _bench()
    recipe = grpo_debug()
    for part, fields in change.items():
        recipe = dataclasses.replace(recipe, **{part: dataclasses.replace(getattr(recipe, part), **fields)})
    with pytest.raises(ValueError, match=named):
        bench.MatchedSettings.from_recipe(recipe)


def test_mean_and_standard_error():
    bench = _bench()
    mean, err = bench.mean_and_stderr([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4)
    assert err == pytest.approx(0.2 / math.sqrt(3))  # sample std 0.2
    single_mean, single_err = bench.mean_and_stderr([0.5])
    assert single_mean == 0.5 and math.isnan(single_err)
    with pytest.raises(ValueError, match="at least one"):
        bench.mean_and_stderr([])


def test_the_table_shows_each_seed_and_the_gain():
    bench = _bench()
    runs = [
        bench.TrainerRun(
            "titanpod", 1, 0.30, 0.50, 0.20, 0.40, step_seconds=[9.0, 2.0, 2.0], step_cpu_seconds=[8.0, 1.0, 3.0]
        ),
        bench.TrainerRun(
            "titanpod", 0, 0.30, 0.40, 0.20, 0.30, step_seconds=[9.0, 1.0, 1.0], step_cpu_seconds=[8.0, 1.0, 1.0]
        ),
        bench.TrainerRun("trl", 0, 0.30, 0.35, 0.20, 0.25, step_seconds=[5.0, 3.0], step_cpu_seconds=[6.0, 4.5]),
        bench.TrainerRun("trl", 1, 0.30, 0.35, 0.20, 0.25, step_seconds=[5.0, 3.0], step_cpu_seconds=[6.0, 4.5]),
    ]
    rows = {label: (ours, theirs) for label, ours, theirs in bench.summary_rows(runs)}
    # gains 10 and 20 points in seed order 0, 1; standard error of (10, 20) is 5
    assert rows["greedy gain (points)"][0] == "15.0 +- 5.0 (10.0, 20.0)"
    assert rows["greedy gain (points)"][1] == "5.0 +- 0.0 (5.0, 5.0)"
    # the first step (warm-up) is left out of seconds per step
    assert rows["wall seconds per step"][0] == "1.50 +- 0.50 (1.00, 2.00)"
    assert bench.speed_ratio(runs) == pytest.approx(3.0 / 1.5)
    # CPU seconds: steps 2 to N of seed 0 (1, 1) and seed 1 (1, 3) average 1.0 and 2.0
    assert rows["CPU seconds per step"][0] == "1.50 +- 0.50 (1.00, 2.00)"
    assert rows["CPU seconds per step"][1] == "4.50 +- 0.00 (4.50, 4.50)"
    assert bench.speed_ratio(runs, "cpu_seconds_per_step") == pytest.approx(4.5 / 1.5)


def test_runs_without_cpu_times_show_nan_not_a_crash():
    bench = _bench()
    run = bench.TrainerRun("trl", 0, 0.1, 0.2, 0.05, 0.15, step_seconds=[4.0, 2.0])
    assert math.isnan(run.cpu_seconds_per_step)


def test_added_seeds_keep_the_earlier_runs(tmp_path):
    bench = _bench()
    earlier = bench.TrainerRun("trl", 0, 0.1, 0.2, 0.05, 0.15, rewards=[0.1, 0.3], step_seconds=[4.0, 2.0])
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"settings": {}, "runs": [dataclasses.asdict(earlier)]}))
    assert bench.earlier_runs(path) == [earlier]
    assert bench.earlier_runs(tmp_path / "absent.json") == []


def _write_results(folder, settings, runs):
    folder.mkdir()
    (folder / "results.json").write_text(
        json.dumps({"settings": settings, "runs": [dataclasses.asdict(r) for r in runs]})
    )


def test_seeds_run_by_separate_processes_merge_into_one_table(tmp_path):
    bench = _bench()
    settings = dataclasses.asdict(bench.MatchedSettings.from_recipe(grpo_debug()))
    seed0 = [bench.TrainerRun(t, 0, 0.1, 0.2, 0.05, 0.15, step_seconds=[4.0, 2.0]) for t in ("titanpod", "trl")]
    seed1 = [bench.TrainerRun(t, 1, 0.1, 0.3, 0.05, 0.15, step_seconds=[4.0, 2.0]) for t in ("titanpod", "trl")]
    _write_results(tmp_path / "a", settings, seed0)
    _write_results(tmp_path / "b", settings, seed1)
    held, runs = bench.merged_runs([tmp_path / "a", tmp_path / "b"])
    assert held == settings
    assert runs == seed0 + seed1

    with pytest.raises(ValueError, match="titanpod seed 0 is already in an earlier folder"):
        bench.merged_runs([tmp_path / "a", tmp_path / "a"])
    _write_results(tmp_path / "c", {**settings, "lr": 1.0}, seed1)
    with pytest.raises(ValueError, match="settings differ"):
        bench.merged_runs([tmp_path / "a", tmp_path / "c"])
    with pytest.raises(ValueError, match=r"no results\.json there"):
        bench.merged_runs([tmp_path / "absent"])
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "results.json").write_text('{"settings": {}, "ru')
    with pytest.raises(ValueError, match=r"is not a results\.json this bench wrote"):
        bench.merged_runs([tmp_path / "cut"])


def test_the_bench_can_replace_the_learning_rate_of_both_trainers(tmp_path):
    bench = _bench()
    recipe = bench.bench_recipe("grpo_debug", tmp_path / "sft", 2, tmp_path, lr=2e-3)
    assert recipe.train.lr == 2e-3 and recipe.train.seed == 2
    assert bench.MatchedSettings.from_recipe(recipe).lr == 2e-3
    assert bench.bench_recipe("grpo_debug", tmp_path / "sft", 0, tmp_path).train.lr == grpo_debug().train.lr


def test_an_sft_folder_without_its_model_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _bench().parse(["--sft", str(tmp_path / "nope")])
    assert "lacks model/ and hf/" in capsys.readouterr().err
