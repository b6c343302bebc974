"""Reading a region of a parameter reads only that region of the stored tensors (recorded ``get_slice`` calls)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import titanpod.checkpoint.region_reader as region_reader
from titanpod.checkpoint import load_hf_checkpoint
from titanpod.checkpoint.pretrained import open_pretrained
from titanpod.checkpoint.region_reader import RegionReader, read_into_model
from titanpod.checkpoint.safetensors_io import SafetensorsFiles, open_safetensors
from titanpod.models.adapters import HFSlot
from titanpod.recipes.families import build_model, decoder_adapters


class RecordingSlice:
    def __init__(self, inner, name: str, log: list) -> None:
        self.inner, self.name, self.log = inner, name, log

    def __getitem__(self, index):
        self.log.append((self.name, index))
        return self.inner[index]

    def get_dtype(self) -> str:
        return self.inner.get_dtype()


class RecordingHandle:
    """A safetensors handle that records every read: which tensor, and which box of it."""

    def __init__(self, inner, log: list) -> None:
        self.inner, self.log = inner, log

    def get_slice(self, name: str) -> RecordingSlice:
        return RecordingSlice(self.inner.get_slice(name), name, self.log)

    def get_tensor(self, name: str) -> torch.Tensor:
        self.log.append((name, "whole"))
        return self.inner.get_tensor(name)


@pytest.fixture
def reads(monkeypatch) -> list:
    log: list = []
    monkeypatch.setattr(region_reader, "open_safetensors", lambda path: RecordingHandle(open_safetensors(path), log))
    return log


def reader_of(folder) -> RegionReader:
    pretrained = open_pretrained(str(folder), decoder_adapters())
    return pretrained.reader(build_model(pretrained.family, pretrained.args))


def test_an_fsdp_or_tp_region_reads_only_its_rows_or_columns(hf_checkpoints, reads):
    folder = hf_checkpoints["llama3"]
    whole = dict(SafetensorsFiles.find(folder).tensors())["model.layers.0.self_attn.q_proj.weight"]
    reader = reader_of(folder)
    rows = reader("layers.0.attention.wq.weight", (slice(32, 64), slice(0, 64)))  # rank 1 of fsdp 2
    assert reads == [("model.layers.0.self_attn.q_proj.weight", (slice(32, 64), slice(0, 64)))]
    assert torch.equal(rows, whole[32:64]) and reader.bytes_read == 32 * 64 * 4
    reads.clear()
    columns = reader("layers.0.attention.wq.weight", (slice(0, 64), slice(16, 32)))  # a tp rank of dim 1
    assert reads == [("model.layers.0.self_attn.q_proj.weight", (slice(0, 64), slice(16, 32)))]
    assert torch.equal(columns, whole[:, 16:32]) and reader.bytes_read == (32 * 64 + 64 * 16) * 4


def test_an_expert_region_opens_only_the_experts_it_holds(hf_checkpoints, reads):
    folder = hf_checkpoints["qwen3_moe"]
    stored = dict(SafetensorsFiles.find(folder).tensors())
    reader = reader_of(folder)
    region = (slice(4, 8), slice(8, 16), slice(0, 64))  # experts 4-7 (ep 2, rank 1), rows 8-15 of each
    part = reader("layers.1.feed_forward.experts.w1", region)
    names = [f"model.layers.1.mlp.experts.{e}.gate_proj.weight" for e in range(4, 8)]
    assert reads == [(name, (slice(8, 16), slice(0, 64))) for name in names]
    assert torch.equal(part, torch.stack([stored[name][8:16] for name in names]))
    assert reader.bytes_read == part.numel() * 4
    reads.clear()
    assert reader("layers.1.feed_forward.experts.w1", (slice(2, 3), slice(0, 32), slice(0, 64))).shape == (1, 32, 64)
    assert [name for name, _ in reads] == ["model.layers.1.mlp.experts.2.gate_proj.weight"]


def test_a_row_range_region_reads_only_the_stacked_tensors_it_crosses(tmp_path, reads):
    parts = {name: torch.arange(12.0).view(4, 3) + 100 * k for k, name in enumerate(("q", "k", "v"))}
    save_file(parts, str(tmp_path / "model.safetensors"))
    layout = {name: HFSlot("fused", rows=(4 * k, 4 * k + 4)) for k, name in enumerate(("q", "k", "v"))}
    reader = RegionReader(SafetensorsFiles.find(tmp_path), layout)
    values = reader("fused", (slice(2, 7), slice(1, 3)))
    assert reads == [("q", (slice(2, 4), slice(1, 3))), ("k", (slice(0, 3), slice(1, 3)))]
    assert torch.equal(values, torch.cat(list(parts.values()))[2:7, 1:3])
    assert reader.bytes_read == values.numel() * 4


@pytest.mark.parametrize("family", ["llama3", "qwen3_moe"])
def test_a_whole_model_reads_everything_once_and_equals_the_whole_load(family, hf_checkpoints, reads):
    folder = hf_checkpoints[family]
    pretrained = open_pretrained(str(folder), decoder_adapters())
    model = build_model(pretrained.family, pretrained.args, device="cpu")
    reader = pretrained.reader(model)
    read_into_model(model, reader)
    expected = load_hf_checkpoint(folder, dtype=torch.float32, adapters=decoder_adapters()).model
    for (name, got), want in zip(model.state_dict().items(), expected.state_dict().values(), strict=True):
        assert torch.equal(got, want), name
    stored = dict(SafetensorsFiles.find(folder).tensors())
    assert sorted(name for name, _ in reads) == sorted(stored)  # each stored tensor read once
    assert reader.bytes_read == sum(t.numel() * t.element_size() for t in stored.values())
