"""The model card of an exported folder is the Hub's (``huggingface_hub.ModelCard``): license, base model,
datasets, tags and the run's figures as metadata, and no folder of this machine anywhere in it."""

from __future__ import annotations

import json

import pytest
from huggingface_hub import ModelCard

from titanpod.runs.hf_export import base_model_of, training_extras


def sft_recipe(init_from: str | None, runs_dir: str, **output) -> dict:
    """An SFT recipe's plain data, as ``to_dict`` gives it, with the fields a card reads."""
    return {
        "name": "sft_debug",
        "model": {"family": "llama3", "flavor": "debug", "init_from": init_from},
        "data": {"source": "task", "task": "reverse", "path": None, "tokenizer": "chars"},
        "output": {"runs_dir": runs_dir, "run_name": "try1", **output},
        "eval": {"examples": 200},
    }


def written_card(tmp_path, extras):
    path = tmp_path / "hf" / "README.md"
    path.parent.mkdir()
    path.write_text(extras.hf_files()["README.md"], encoding="utf-8")
    return path.read_text(encoding="utf-8"), ModelCard.load(path).data


def test_a_fine_tune_of_a_hub_model_names_it_and_the_run_s_figures(tmp_path):
    recipe = sft_recipe("some-org/some-model", str(tmp_path / "runs"), license="llama3.1")
    extras = training_extras(recipe, "llama3", 1234, 300, final_loss=0.25, accuracy=0.9, accuracy_task="reverse")
    text, metadata = written_card(tmp_path, extras)
    assert metadata.license == "llama3.1"
    assert metadata.base_model == "some-org/some-model"
    assert metadata.datasets == ["titanpod-reverse"]
    assert metadata.tags == ["titanpod", "llama3", "sft"]
    assert metadata.library_name == "transformers" and metadata.pipeline_tag == "text-generation"
    figures = {result.metric_type: result.metric_value for result in metadata.eval_results}
    assert figures == {"loss": pytest.approx(0.25), "accuracy": pytest.approx(0.9)}
    assert "| held-out accuracy (reverse) | 90.0% |" in text
    assert str(tmp_path) not in text and "PATH_OR_REPO" not in text
    assert extras.about["base_model"] == "some-org/some-model" and extras.about["accuracy"] == 0.9


def test_a_fine_tune_of_a_local_folder_names_no_base_model_and_no_path(tmp_path):
    folder = tmp_path / "runs" / "pre" / "model"
    folder.mkdir(parents=True)
    extras = training_extras(sft_recipe(str(folder), str(tmp_path / "runs")), "llama3", 1234, 10, final_loss=1.5)
    text, metadata = written_card(tmp_path, extras)
    assert metadata.base_model is None and metadata.license == "apache-2.0"  # the default, stated in the recipe
    assert str(tmp_path) not in text
    assert json.dumps("<local>/model") in text  # the recipe's init_from, by its last part


def test_a_local_folder_imported_from_the_hub_passes_its_hub_id_on(tmp_path):
    folder = tmp_path / "imported"
    folder.mkdir()
    (folder / "model.json").write_text(json.dumps({"family": "llama3", "args": {}, "about": {"source": "org/base"}}))
    assert base_model_of(str(folder)) == "org/base"
    assert base_model_of(None) is None
    assert base_model_of("/no/such/folder") is None


def test_a_pretraining_run_on_files_lists_no_dataset_and_keeps_the_file_name_only(tmp_path):
    data_file = tmp_path / "corpus" / "train.jsonl"
    recipe = {
        "model": {"family": "qwen3", "flavor": "debug"},
        "data": {"source": "jsonl", "path": str(data_file), "tokenizer": str(tmp_path / "tok" / "tokenizer.json")},
        "output": {"runs_dir": str(tmp_path)},
    }
    extras = training_extras(recipe, "qwen3", 99, 5, tokens=640, tokenizer=({}, extras_ids()))
    text, metadata = written_card(tmp_path, extras)
    assert metadata.datasets is None and metadata.tags == ["titanpod", "qwen3", "pretraining"]
    assert metadata.eval_results is None  # no figure known: no model-index
    assert "| data | jsonl train.jsonl, tokenizer tokenizer.json |" in text
    assert str(tmp_path) not in text


def extras_ids():
    from titanpod.checkpoint.special_tokens import SpecialTokens

    return SpecialTokens()
