"""titanpod-pretrain --model.init-from under torchrun: FSDP 2 creates each rank's shards from the folder."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.cli_runs import run_cli
from titanpod.checkpoint import save_hf_checkpoint
from titanpod.checkpoint.hf_files import iter_hf_tensors
from titanpod.recipes.families import build_model, hf_adapter


@pytest.mark.slow
def test_fsdp2_pretraining_starts_from_a_hugging_face_folder_and_saves_its_weights(tmp_path):
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(7)  # not the run's seed: the run must take these weights from the folder
    folder = save_hf_checkpoint(model, hf_adapter("llama3"), tmp_path / "start", max_shard_size="1MB")
    run = [
        "--model.init-from", str(folder), "--parallel.fsdp", "2", "--train.steps", "1", "--train.warmup-steps", "0",
        "--train.lr", "0", "--data.seq-len", "32", "--data.batch-size", "2", "--output.run-name", "from-hf",
        "--output.no-tensorboard",
    ]  # fmt: skip
    done = run_cli("titanpod.pretrain.cli", run, tmp_path, processes=2)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert f"parameters from {folder}" in done.stdout and "reading the weights of" in done.stdout
    saved = load_file(tmp_path / "runs" / "from-hf" / "model" / "model.safetensors")
    expected = dict(model.named_parameters())
    assert saved.keys() == expected.keys()
    for name, tensor in saved.items():  # lr 0: the weights the ranks read, gathered and written back unchanged
        assert torch.equal(tensor, expected[name].detach()), name


@pytest.mark.slow
def test_fsdp2_sft_starts_from_a_hugging_face_folder_and_exports_its_weights(tmp_path):
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(7)
    folder = save_hf_checkpoint(model, hf_adapter("llama3"), tmp_path / "start", max_shard_size="1MB")
    run = [
        "--recipe", "sft_debug", "--model.init-from", str(folder), "--parallel.fsdp", "2", "--train.steps", "1",
        "--train.warmup-steps", "0", "--train.lr", "0", "--data.train-examples", "64", "--data.seq-len", "32",
        "--data.batch-size", "2", "--eval.no-enabled", "--output.run-name", "sft", "--output.no-tensorboard",
    ]  # fmt: skip
    done = run_cli("titanpod.posttrain.cli", run, tmp_path, processes=2)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert f"parameters from {folder} (llama3)" in done.stdout
    expected = dict(model.named_parameters())
    saved = load_file(tmp_path / "runs" / "sft" / "model" / "model.safetensors")
    assert saved.keys() == expected.keys()
    assert all(torch.equal(tensor, expected[name].detach()) for name, tensor in saved.items())
    exported, started = dict(iter_hf_tensors(tmp_path / "runs" / "sft" / "hf")), dict(iter_hf_tensors(folder))
    assert exported.keys() == started.keys()
    assert all(torch.equal(tensor, started[name]) for name, tensor in exported.items())
    assert (tmp_path / "runs" / "sft" / "hf" / "tokenizer.json").is_file()
