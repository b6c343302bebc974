"""The one safetensors reader/writer: shards and index written and read back, partial reads, strict checks."""

from __future__ import annotations

import json

import pytest
import torch

from titanpod.checkpoint.errors import CheckpointMismatchError
from titanpod.checkpoint.safetensors_io import (
    DIFFUSERS_FILES,
    SafetensorsFiles,
    widest_float_dtype,
    write_safetensors,
)


def tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {f"block.{i}.weight": torch.randn(8, 4, generator=generator) for i in range(5)}


def test_shards_index_and_partial_reads(tmp_path):
    written = write_safetensors(tmp_path, tensors().items(), DIFFUSERS_FILES, max_shard_bytes=300)
    assert written == [f"diffusion_pytorch_model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    index = json.loads((tmp_path / DIFFUSERS_FILES.index).read_text())
    assert index["metadata"]["total_size"] == 5 * 8 * 4 * 4
    assert list(index["weight_map"]) == sorted(tensors())
    files = SafetensorsFiles.find(tmp_path, DIFFUSERS_FILES)
    assert dict(files.tensors()).keys() == tensors().keys()
    for name, tensor in files.tensors():
        assert torch.equal(tensor, tensors()[name]), name
    assert torch.equal(files.get_slice("block.3.weight")[2:5], tensors()["block.3.weight"][2:5])
    with pytest.raises(KeyError, match=r"No tensor block\.9\.weight"):
        files.get_slice("block.9.weight")


def test_one_file_in_the_given_dtype_and_the_widest_dtype_of_a_mix(tmp_path):
    mixed = {"a": torch.zeros(2, dtype=torch.float16), "b": torch.zeros(2, dtype=torch.bfloat16)}
    assert write_safetensors(tmp_path, mixed.items()) == ["model.safetensors"]
    files = SafetensorsFiles.find(tmp_path)
    assert files.stored_dtypes() == {"F16", "BF16"}
    assert widest_float_dtype(files.stored_dtypes()) == torch.bfloat16
    write_safetensors(tmp_path, mixed.items(), dtype=torch.float32)
    assert SafetensorsFiles.find(tmp_path).stored_dtypes() == {"F32"}


def test_check_names_each_problem_with_its_file(tmp_path):
    write_safetensors(tmp_path, tensors().items(), DIFFUSERS_FILES, max_shard_bytes=300)
    files = SafetensorsFiles.find(tmp_path, DIFFUSERS_FILES)
    expected = {name: tuple(t.shape) for name, t in tensors().items()}
    expected["block.1.weight"] = (8, 5)
    expected["block.7.weight"] = (1,)
    del expected["block.4.weight"]
    with pytest.raises(CheckpointMismatchError) as caught:
        files.check(expected, "the folder does not fit", {"block.7.weight": "titanpod layer 7"}, hint="Try again.")
    message = str(caught.value)
    assert message.startswith("the folder does not fit (3 problems):")
    assert "mis-shaped: block.1.weight (in diffusion_pytorch_model-00001-of-00003.safetensors) is (8, 4)" in message
    assert "unexpected: block.4.weight (in diffusion_pytorch_model-00003-of-00003.safetensors)" in message
    assert "missing: block.7.weight (titanpod layer 7)" in message
    assert message.endswith("\nTry again.")


def test_pickles_alone_are_refused_by_name(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"never read")
    with pytest.raises(FileNotFoundError, match=r"only pickled weights \(pytorch_model\.bin\)"):
        SafetensorsFiles.find(tmp_path)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"No model\.safetensors\.index\.json or model\.safetensors in"):
        SafetensorsFiles.find(tmp_path)


def test_shard_sizes_read_like_the_hub_writes_them_and_a_bad_one_names_the_form():
    from titanpod.checkpoint.safetensors_io import parse_size

    assert [parse_size(text) for text in ("5GB", "500MB", "2GiB", "1.5 GB", "100KB", "7", 7)] == [
        5 * 10**9, 500 * 10**6, 2 * 1024**3, 15 * 10**8, 100_000, 7, 7,
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"Cannot read the size 'five GB'; write it like 5GB, 500MB or 2GiB"):
        parse_size("five GB")
