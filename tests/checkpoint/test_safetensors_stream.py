"""Safetensors written header first, tensor by tensor: the same bytes as ``safetensors.torch.save_file``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from titanpod.checkpoint.safetensors_io import DIFFUSERS_FILES, SafetensorsFiles, write_safetensors, write_streamed
from titanpod.checkpoint.safetensors_stream import StreamedFile, TensorEntry


def mixed_tensors() -> dict[str, torch.Tensor]:
    """Names whose sorted order differs from their insertion order, every dtype titanpod writes, and odd shapes."""
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "layers.2.w": torch.randn(3, 5, generator=generator),
        "layers.10.w": torch.randn(7, generator=generator).to(torch.bfloat16),
        "layers.1.w": torch.randn(2, 2, 2, generator=generator).to(torch.float16),
        "layers.1.scale": torch.randn((), generator=generator),
        "empty": torch.zeros(0, 4),
        "steps": torch.arange(3, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "wide": torch.randn(5, generator=generator, dtype=torch.float64),
    }
    return tensors


def stream(path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    entries = [TensorEntry(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]
    with StreamedFile(path, entries, metadata) as file:
        for entry in file.order:
            file.append(tensors[entry.name])


def test_a_streamed_file_has_the_bytes_save_file_writes(tmp_path):
    tensors = mixed_tensors()
    save_file(tensors, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})
    stream(tmp_path / "streamed.safetensors", tensors, {"format": "pt"})
    assert (tmp_path / "streamed.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()


def test_metadata_keeps_its_order_so_the_same_weights_give_the_same_bytes(tmp_path):
    tensors = mixed_tensors()
    metadata = {"format": "pt", "step": "5", "source": "x"}
    save_file(tensors, str(tmp_path / "reference.safetensors"), metadata=metadata)  # lists metadata in any order
    stream(tmp_path / "streamed.safetensors", tensors, metadata)
    reference, streamed = ((tmp_path / name).read_bytes() for name in ("reference.safetensors", "streamed.safetensors"))
    length = int.from_bytes(streamed[:8], "little")
    header = json.loads(streamed[8 : 8 + length])
    assert list(header["__metadata__"]) == ["format", "step", "source"]
    assert header == json.loads(reference[8 : 8 + length])
    assert streamed[8 + length :] == reference[8 + length :]
    loaded = load_file(str(tmp_path / "streamed.safetensors"))
    assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())


def test_a_file_left_before_every_tensor_arrived_is_an_error_naming_the_missing_one(tmp_path):
    tensors = mixed_tensors()
    entries = [TensorEntry(name, tuple(t.shape), t.dtype) for name, t in tensors.items()]
    incomplete = pytest.raises(RuntimeError, match=r"incomplete: layers\.1\.scale was never written")
    with incomplete, StreamedFile(tmp_path / "part.safetensors", entries) as file:
        for entry in file.order[:3]:
            file.append(tensors[entry.name])
    mis_shaped = pytest.raises(ValueError, match=r"steps has shape \(4,\), its header says \(3,\)")
    with mis_shaped, StreamedFile(tmp_path / "part.safetensors", entries) as file:
        file.append(torch.zeros(4, dtype=torch.int64))  # the widest dtype comes first


def test_shards_equal_save_file_of_each_group_and_a_silent_rank_fetches_in_the_same_order(tmp_path):
    generator = torch.Generator().manual_seed(1)
    tensors = {f"block.{i}.weight": torch.randn(8, 4, generator=generator) for i in (0, 1, 2, 10, 11)}
    written = write_safetensors(tmp_path, tensors.items(), DIFFUSERS_FILES, max_shard_bytes=300, dtype=torch.bfloat16)
    index = json.loads((tmp_path / DIFFUSERS_FILES.index).read_text())
    assert index["metadata"]["total_size"] == 5 * 8 * 4 * 2
    for file in written:
        group = {name: tensors[name].to(torch.bfloat16) for name, owner in index["weight_map"].items() if owner == file}
        save_file(group, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})
        assert (tmp_path / file).read_bytes() == (tmp_path / "reference.safetensors").read_bytes(), file
    assert dict(SafetensorsFiles.find(tmp_path, DIFFUSERS_FILES).tensors()).keys() == tensors.keys()

    entries = [TensorEntry(name, tuple(t.shape), torch.bfloat16) for name, t in tensors.items()]
    orders: dict[str, list[str]] = {"writer": [], "silent": []}
    for role, directory in (("writer", tmp_path / "again"), ("silent", None)):
        if directory is not None:
            directory.mkdir()

        def fetch(name: str, role: str = role) -> torch.Tensor:
            orders[role].append(name)
            return tensors[name]

        write_streamed(directory, entries, fetch, DIFFUSERS_FILES, max_shard_bytes=300)
    assert orders["writer"] == orders["silent"] and sorted(orders["writer"]) == sorted(tensors)
    for file in written:
        assert (tmp_path / "again" / file).read_bytes() == (tmp_path / file).read_bytes()


def test_tensors_larger_than_a_block_reach_the_writer_in_blocks_and_give_the_same_bytes(tmp_path, monkeypatch):
    """One process as a gloo group of one: every block ``gather_blocks`` hands the writer (whole parameters,
    an expert, a row range; fp32 stored as bf16) is at most ``BLOCK_BYTES``, and the file equals save_file's."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from titanpod.checkpoint import gather, safetensors_stream
    from titanpod.models.adapters import HFSlot

    monkeypatch.setattr(safetensors_stream, "BLOCK_BYTES", 256)
    generator = torch.Generator().manual_seed(2)
    params = {"embed": torch.randn(40, 8, generator=generator), "experts": torch.randn(3, 20, 8, generator=generator)}
    params["norm"], params["scale"] = torch.randn(100, generator=generator), torch.randn((), generator=generator)
    layout = {
        "embed": HFSlot("embed"), "expert.1": HFSlot("experts", expert=1), "expert.0": HFSlot("experts", expert=0),
        "rows": HFSlot("embed", rows=(5, 37)), "norm": HFSlot("norm"), "scale": HFSlot("scale"),
    }  # fmt: skip
    expected = {name: slot.view(params[slot.name]).to(torch.bfloat16) for name, slot in layout.items()}
    save_file(expected, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        placed = {name: [Shard(0) if t.ndim else Replicate()] for name, t in params.items()}
        sharded = {name: distribute_tensor(t, mesh, placed[name]) for name, t in params.items()}
        entries = [TensorEntry(name, tuple(t.shape), torch.bfloat16) for name, t in expected.items()]
        sizes: dict[str, list[int]] = {}
        with StreamedFile(tmp_path / "blocks.safetensors", entries, {"format": "pt"}) as file:
            for entry in file.order:
                blocks = list(gather.gather_blocks(sharded[layout[entry.name].name], layout[entry.name]))
                sizes[entry.name] = [block.numel() * block.element_size() for block in blocks]
                file.append(blocks)
    finally:
        dist.destroy_process_group()
    assert all(size <= 256 for block_sizes in sizes.values() for size in block_sizes), sizes
    counts = {name: len(block_sizes) for name, block_sizes in sizes.items()}  # 8 rows of 8 fp32 a block
    assert counts == {"embed": 5, "rows": 4, "expert.0": 3, "expert.1": 3, "norm": 2, "scale": 1}
    assert (tmp_path / "blocks.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()


def test_a_sharded_save_gathers_every_block_into_the_same_bytes_and_writes_the_same_file(tmp_path, monkeypatch):
    """``ModelTensors`` hands the writer each block of a sharded parameter in one reused buffer (no fresh
    allocation a block, which left the writer's heap holding freed blocks); the file is unchanged."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from titanpod.checkpoint import safetensors_stream
    from titanpod.checkpoint.model_tensors import ModelTensors, identity_layout

    monkeypatch.setattr(safetensors_stream, "BLOCK_BYTES", 256)
    generator = torch.Generator().manual_seed(3)
    params = {"embed": torch.randn(40, 8, generator=generator), "wide": torch.randn(4, 16, generator=generator)}
    save_file(params, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = {name: distribute_tensor(t, mesh, [Shard(0)]) for name, t in params.items()}
        source = ModelTensors(identity_layout(list(sharded)), sharded)
        pointers: set[int] = set()
        with StreamedFile(tmp_path / "blocks.safetensors", source.entries, {"format": "pt"}) as file:
            for entry in file.order:
                blocks = source.fetch(entry.name)

                def seen(blocks=blocks):
                    for block in blocks:
                        pointers.add(block.untyped_storage().data_ptr())
                        yield block

                file.append(seen())
    finally:
        dist.destroy_process_group()
    assert len(pointers) == 1  # 7 blocks of 256 bytes, one buffer
    assert (tmp_path / "blocks.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()


def test_blocks_that_are_not_whole_rows_or_do_not_add_up_are_refused(tmp_path):
    entries = [TensorEntry("w", (4, 3), torch.float32)]
    not_rows = pytest.raises(ValueError, match=r"a block of w has shape \(2, 2\)")
    with not_rows, StreamedFile(tmp_path / "a", entries) as f:
        f.append([torch.zeros(2, 2)])
    with pytest.raises(ValueError, match=r"3 rows of w arrived"), StreamedFile(tmp_path / "b", entries) as f:
        f.append([torch.zeros(2, 3), torch.zeros(1, 3)])
