"""A full disk during a save is a message naming the folder and the bytes needed; nothing half-written stays."""

from __future__ import annotations

import errno

import pytest
import torch

from titanpod.checkpoint import load_weights, save_weights
from titanpod.checkpoint import weights as weights_module
from titanpod.checkpoint.disk_space import DiskFullError
from titanpod.models import DecoderArgs, Transformer

ARGS = DecoderArgs(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=48)


def model(seed: int) -> Transformer:
    with torch.device("meta"):
        built = Transformer(ARGS)
    built.to_empty(device="cpu")
    built.init_weights(seed)
    return built


def test_a_full_disk_while_writing_weights_names_the_folder_and_size(tmp_path, monkeypatch):
    earlier = model(0)
    save_weights(earlier, tmp_path / "model")
    real_write = weights_module.write_streamed

    def write_until_full(directory, *args, **kwargs):
        (directory / "model.safetensors").write_bytes(b"half")  # some bytes made it before the disk filled
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(weights_module, "write_streamed", write_until_full)
    with pytest.raises(DiskFullError) as error:
        save_weights(model(1), tmp_path / "model")
    message = str(error.value)
    needed = sum(param.numel() * param.element_size() for param in earlier.parameters())
    assert str(tmp_path / "model") in message and f"{needed:,} bytes" in message and "free" in message
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # no staging folder left
    monkeypatch.setattr(weights_module, "write_streamed", real_write)
    reloaded = model(2)
    load_weights(reloaded, tmp_path / "model")  # the earlier weights are whole
    assert all(torch.equal(a, b) for a, b in zip(reloaded.parameters(), earlier.parameters(), strict=True))


def test_other_write_errors_pass_through_unchanged(tmp_path, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(weights_module, "write_streamed", denied)
    with pytest.raises(PermissionError):
        save_weights(model(0), tmp_path / "model")
    assert not list(tmp_path.iterdir())
