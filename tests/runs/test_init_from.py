"""Pretraining from weights on disk (``model.init_from``): a titanpod model folder or a Hugging Face export."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from titanpod.checkpoint import CheckpointConfig
from titanpod.checkpoint.pretrained import open_pretrained
from titanpod.recipes import Recipe, get_recipe
from titanpod.recipes.families import decoder_adapters
from titanpod.recipes.model_shape import ModelShape
from titanpod.runs import run_pretraining
from titanpod.runs.trainer_export import read_trainer_model


def recipe(runs_dir, run_name: str, steps: int = 2, **model) -> Recipe:
    base = get_recipe("llama3_debug")
    return dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, **model),
        train=dataclasses.replace(base.train, steps=steps, warmup_steps=0, log_every=1),
        data=dataclasses.replace(base.data, seq_len=32, batch_size=2),
        output=dataclasses.replace(base.output, runs_dir=str(runs_dir), run_name=run_name, tensorboard=False),
        checkpoint=CheckpointConfig(export_hf=True, at_end=False),
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 2-step run: its model/ and hf/ folders."""
    runs = tmp_path_factory.mktemp("runs")
    result = run_pretraining(recipe(runs, "first"))
    return result.run_dir


def test_a_run_from_a_model_folder_or_its_hugging_face_export_starts_from_those_weights(trained, tmp_path):
    frozen = []
    for source in ("model", "hf"):
        start = recipe(tmp_path, f"from-{source}", steps=1, init_from=str(trained / source))
        start = dataclasses.replace(start, train=dataclasses.replace(start.train, lr=0.0))  # the weights stay put
        frozen.append(run_pretraining(start))
    from_model, from_hf = frozen
    assert from_model.summary.losses == from_hf.summary.losses
    written = load_file(from_model.weights_path)
    original = load_file(trained / "model" / "model.safetensors")
    assert written.keys() == original.keys()
    assert all(torch.equal(written[name], original[name]) for name in original)
    assert from_model.weights_path.read_bytes() == from_hf.weights_path.read_bytes()  # same weights, same bytes


def test_sizes_the_folder_does_not_have_or_a_folder_with_no_model_are_refused_before_training(trained, tmp_path):
    folder = str(trained / "model")
    with pytest.raises(ValueError, match=r"2 fields differ\):\n  n_layers: 6 in the folder, 2 in the recipe") as caught:
        run_pretraining(recipe(tmp_path, "shape", init_from=folder, shape=ModelShape(n_layers=2, ffn_dim=64)))
    assert "ffn_dim: 768 in the folder, 64 in the recipe" in str(caught.value)
    assert "--model.shape.<field>" in str(caught.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"holds neither model.json .* nor config.json"):
        run_pretraining(recipe(tmp_path, "empty", init_from=str(tmp_path / "empty")))
    assert not (tmp_path / "shape").exists()  # no run directory: refused before anything was written


def test_the_folder_gives_the_family_the_shape_and_the_tokenizer_whatever_the_flavor(trained, tmp_path):
    folder = trained / "model"
    start = recipe(tmp_path, "other-family", steps=1, family="qwen3", flavor="8B", init_from=str(folder))
    start = dataclasses.replace(
        start,
        model=dataclasses.replace(start.model, shape=ModelShape(max_seq_len=64)),
        checkpoint=dataclasses.replace(start.checkpoint, at_end=True),
    )
    result = run_pretraining(start)
    written = json.loads((result.run_dir / "recipe.json").read_text(encoding="utf-8"))
    assert written["model"]["family"] == "llama3"  # the folder's, as the run trained it
    assert written["data"]["tokenizer"] == str(folder)  # the folder's own tokenizer
    model = json.loads((result.run_dir / "model" / "model.json").read_text(encoding="utf-8"))
    assert model["args"]["n_layers"] == 6 and model["args"]["max_seq_len"] == 64  # the folder's, but the length asked
    saved = read_trainer_model(result.run_dir / "checkpoints" / "step-000001")  # what an export reads back
    folder_args = open_pretrained(str(folder), decoder_adapters()).args
    assert saved.family == "llama3" and saved.model.args == dataclasses.replace(folder_args, max_seq_len=64)
