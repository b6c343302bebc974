"""Safetensors weights: exact round trip, strict key accounting, atomic directories."""

import json

import pytest
import torch
from safetensors import safe_open

from titanpod.checkpoint import CheckpointMismatchError, atomic_directory, load_weights, save_weights
from titanpod.models import DecoderArgs, Transformer

ARGS = DecoderArgs(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=48)


def model(seed: int, args: DecoderArgs = ARGS) -> Transformer:
    with torch.device("meta"):
        built = Transformer(args)
    built.to_empty(device="cpu")
    built.init_weights(seed)
    return built


def test_round_trip_is_bit_exact(tmp_path):
    source, target = model(0), model(1)
    path = save_weights(source, tmp_path / "step-1", {"step": 1}, extra_files={"recipe.json": "{}"})
    load_weights(target, path.parent)
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with safe_open(str(path), framework="pt") as handle:
        assert handle.metadata()["format"] == "pt"
        assert json.loads(handle.metadata()["step"]) == 1
    assert (path.parent / "recipe.json").read_text() == "{}"


def test_tied_weights_are_stored_once(tmp_path):
    tied = DecoderArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=48, tie_embeddings=True)
    path = save_weights(model(0, tied), tmp_path / "w")
    with safe_open(str(path), framework="pt") as handle:
        names = set(handle.keys())
    assert "tok_embeddings.weight" in names and "output.weight" not in names
    target = model(1, tied)
    load_weights(target, path)
    assert torch.equal(target.head_weight, model(0, tied).tok_embeddings.weight)


def test_mismatch_lists_every_problem_and_leaves_the_model_untouched(tmp_path):
    path = save_weights(model(0), tmp_path / "w")
    other_args = DecoderArgs(dim=32, n_layers=3, n_heads=2, n_kv_heads=1, vocab_size=80, ffn_dim=48)
    target = model(1, other_args)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as caught:
        load_weights(target, path)
    message = str(caught.value)
    assert "missing: layers.2.attention.wq.weight" in message
    assert "mis-shaped: tok_embeddings.weight (in model.safetensors) is (64, 32), the model expects (80, 32)" in message
    assert "model family and flavor" in message
    for name, tensor in target.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="No weights at"):
        load_weights(model(0), tmp_path / "nowhere")


def test_atomic_directory_appears_only_on_success(tmp_path):
    final = tmp_path / "ckpt"
    with atomic_directory(final) as staging:
        (staging / "a.txt").write_text("first")
    assert (final / "a.txt").read_text() == "first"
    with pytest.raises(RuntimeError), atomic_directory(final) as staging:
        (staging / "a.txt").write_text("second, half written")
        raise RuntimeError("killed mid-save")
    assert (final / "a.txt").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
