"""A path field that starts with ``~`` means the home folder wherever it comes from: a recipe file's value, or a
flag written ``--output.runs-dir=~/r``, reaches the config without a shell to expand it."""

from __future__ import annotations

import pytest

from titanpod.checkpoint import CheckpointConfig
from titanpod.data.config import DataConfig
from titanpod.data.images.config import ImageDataConfig
from titanpod.data.sft.config import SFTDataConfig
from titanpod.graph import TrainConfig
from titanpod.recipes.posttrain.grpo_recipe import GRPOConfig, GRPOModelConfig
from titanpod.recipes.posttrain.sft_recipe import SFTModelConfig
from titanpod.recipes.recipe import ModelConfig, OutputConfig, Recipe

PATH_FIELDS = [  # (the config, the field, the other fields a value there needs)
    (CheckpointConfig, "dir", {}),
    (DataConfig, "path", {"source": "text"}),
    (DataConfig, "tokenizer", {}),
    (ImageDataConfig, "path", {"source": "imagefolder"}),
    (SFTDataConfig, "path", {"source": "jsonl"}),
    (SFTDataConfig, "tokenizer", {}),
    (TrainConfig, "compile_cache_dir", {}),
    (ModelConfig, "init_from", {}),
    (SFTModelConfig, "init_from", {}),
    (GRPOModelConfig, "init_from", {}),
    (GRPOModelConfig, "tokenizer", {}),
    (GRPOConfig, "data_path", {}),
    (GRPOConfig, "eval_path", {"data_path": "/data/train.jsonl"}),
    (OutputConfig, "runs_dir", {}),
]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(("config", "name", "needs"), PATH_FIELDS, ids=[f"{c.__name__}.{n}" for c, n, _ in PATH_FIELDS])
def test_a_leading_tilde_is_the_home_folder(config, name, needs, home):
    assert getattr(config(**{name: "~/data/x", **needs}), name) == f"{home}/data/x"


@pytest.mark.parametrize("value", ["gs://bucket/~x", "data/~x", "owner/model"])
def test_urls_hub_ids_and_paths_without_a_leading_tilde_are_kept(value, home):
    assert OutputConfig(runs_dir=value).runs_dir == value and ModelConfig(init_from=value).init_from == value


def test_a_recipe_files_runs_dir_under_home_is_read_as_home(home):
    data = Recipe().to_dict()
    data["output"]["runs_dir"] = "~/r"
    assert Recipe.from_dict(data).output.runs_dir == f"{home}/r"
