"""Bad Hugging Face checkpoints fail with errors that name the file or tensor."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from titanpod.checkpoint import CheckpointMismatchError, load_hf_checkpoint
from titanpod.models.adapters.base import UnsupportedConfigError
from titanpod.recipes.families import decoder_adapters


@pytest.fixture
def llama_copy(hf_checkpoints, tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(hf_checkpoints["llama3"], folder)
    return folder


def index_of(folder):
    return json.loads((folder / "model.safetensors.index.json").read_text())


def shard_holding(folder, name):
    return folder / index_of(folder)["weight_map"][name]


def test_truncated_shard_is_named(llama_copy):
    shard = shard_holding(llama_copy, "model.layers.1.mlp.down_proj.weight")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"Shard .*{shard.name} is corrupted or truncated"):
        load_hf_checkpoint(llama_copy, adapters=decoder_adapters())


def test_garbage_shard_is_named(llama_copy):
    shard = shard_holding(llama_copy, "model.norm.weight")
    shard.write_bytes(b"\x00\x01 not a safetensors file")
    with pytest.raises(ValueError, match=rf"{shard.name} is corrupted or truncated"):
        load_hf_checkpoint(llama_copy, adapters=decoder_adapters())


def test_missing_shard_file_is_named(llama_copy):
    shard = shard_holding(llama_copy, "model.norm.weight")
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=rf"Shard .*{shard.name} is listed in the index but missing"):
        load_hf_checkpoint(llama_copy, adapters=decoder_adapters())


def rewrite_shard(folder, name, change):
    shard = shard_holding(folder, name)
    tensors = load_file(str(shard))
    change(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return shard


def test_missing_tensor_is_named(llama_copy):
    name = "model.layers.0.self_attn.k_proj.weight"
    rewrite_shard(llama_copy, name, lambda tensors: tensors.pop(name))
    index = index_of(llama_copy)
    del index["weight_map"][name]
    (llama_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        CheckpointMismatchError,
        match=r"missing: model\.layers\.0\.self_attn\.k_proj\.weight \(titanpod layers\.0\.attention\.wk\.weight\)",
    ):
        load_hf_checkpoint(llama_copy, adapters=decoder_adapters())


def test_wrong_shape_is_named_with_both_shapes(llama_copy):
    name = "model.layers.1.mlp.up_proj.weight"

    def shrink(tensors):
        tensors[name] = tensors[name][:-1].contiguous()

    shard = rewrite_shard(llama_copy, name, shrink)
    with pytest.raises(CheckpointMismatchError) as caught:
        load_hf_checkpoint(llama_copy, adapters=decoder_adapters())
    assert f"mis-shaped: {name} (in {shard.name}) is (95, 64), the model expects (96, 64)" in str(caught.value)


def test_unexpected_tensor_is_named(llama_copy):
    name = "model.norm.weight"
    rewrite_shard(llama_copy, name, lambda tensors: tensors.update({"model.extra.weight": torch.ones(3)}))
    index = index_of(llama_copy)
    index["weight_map"]["model.extra.weight"] = index["weight_map"][name]
    (llama_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointMismatchError, match=r"unexpected: model\.extra\.weight"):
        load_hf_checkpoint(llama_copy, adapters=decoder_adapters())


def test_config_for_another_architecture_is_named(llama_copy):
    config = json.loads((llama_copy / "config.json").read_text())
    config["architectures"] = ["MistralForCausalLM"]
    config["model_type"] = "mistral"
    (llama_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedConfigError, match=r"MistralForCausalLM.*supported: LlamaForCausalLM"):
        load_hf_checkpoint(llama_copy, adapters=decoder_adapters())


def test_config_of_a_different_shape_reports_every_mismatch(llama_copy):
    config = json.loads((llama_copy / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (llama_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointMismatchError,
        match=r"missing: model\.layers\.2\.self_attn\.q_proj\.weight \(titanpod layers\.2\.attention\.wq\.weight\)",
    ):
        load_hf_checkpoint(llama_copy, adapters=decoder_adapters())


def test_unsupported_arithmetic_is_refused(llama_copy):
    config = json.loads((llama_copy / "config.json").read_text())
    config["attention_bias"] = True
    (llama_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedConfigError, match="attention_bias=True"):
        load_hf_checkpoint(llama_copy, adapters=decoder_adapters())


def test_not_a_checkpoint_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No config\.json"):
        load_hf_checkpoint(tmp_path, adapters=decoder_adapters())
