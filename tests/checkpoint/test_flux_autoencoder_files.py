"""The FLUX autoencoder in diffusers' folder layout: titanpod reads save_pretrained's output, diffusers reads ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from titanpod.checkpoint.errors import CheckpointMismatchError
from titanpod.checkpoint.flux_autoencoder_files import (
    INDEX_FILE,
    WEIGHTS_FILE,
    load_flux_autoencoder,
    save_flux_autoencoder,
)
from titanpod.models.adapters.flux_autoencoder import UnsupportedAutoencoderConfigError
from titanpod.models.flux.autoencoder import build_flux_autoencoder

diffusers = pytest.importorskip("diffusers")

TINY = {
    "block_out_channels": [32, 64],
    "down_block_types": ["DownEncoderBlock2D"] * 2,
    "up_block_types": ["UpDecoderBlock2D"] * 2,
    "layers_per_block": 2,
    "norm_num_groups": 8,
    "latent_channels": 16,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
}


@pytest.fixture(scope="module")
def reference():
    """A tiny random diffusers AutoencoderKL with FLUX's settings."""
    torch.manual_seed(0)
    return diffusers.AutoencoderKL(**TINY).eval()


@pytest.fixture(scope="module")
def saved(reference, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``reference`` written by diffusers' own save_pretrained."""
    directory = tmp_path_factory.mktemp("vae") / "vae"
    reference.save_pretrained(directory, safe_serialization=True)
    return directory


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
    latents = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(2))
    return images, latents


def _assert_same_outputs(model, reference) -> None:
    images, latents = _inputs()
    with torch.no_grad():
        ours, theirs = model.encode(images), reference.encode(images).latent_dist
        torch.testing.assert_close(ours.mean, theirs.mean, atol=1e-4, rtol=0)
        torch.testing.assert_close(ours.logvar, theirs.logvar, atol=1e-4, rtol=0)
        torch.testing.assert_close(model.decode(latents), reference.decode(latents).sample, atol=1e-4, rtol=0)


def test_load_what_diffusers_saved(saved: Path, reference) -> None:
    """fp32, measured max abs: mean 8.9e-7, logvar 1.0e-6, decode 2.1e-6; bound 1e-4."""
    model = load_flux_autoencoder(saved)
    assert model.args.block_out_channels == (32, 64)
    assert (model.args.scaling_factor, model.args.shift_factor) == (0.3611, 0.1159)
    assert next(model.parameters()).dtype == torch.float32
    _assert_same_outputs(model, reference)


def test_load_reads_a_pipeline_folder_through_vae(saved: Path, reference, tmp_path: Path) -> None:
    pipeline = tmp_path / "FLUX.1-tiny"
    (pipeline / "vae").mkdir(parents=True)
    for file in saved.iterdir():
        (pipeline / "vae" / file.name).write_bytes(file.read_bytes())
    _assert_same_outputs(load_flux_autoencoder(pipeline), reference)


@pytest.mark.parametrize("max_shard_bytes", [10 * 1000**3, 1_000_000])
def test_export_loads_back_into_diffusers(saved: Path, reference, tmp_path: Path, max_shard_bytes: int) -> None:
    """One file, or shards with diffusers' index: from_pretrained reads both and gives the same outputs."""
    model = load_flux_autoencoder(saved)
    out = save_flux_autoencoder(model, tmp_path / "export", max_shard_bytes=max_shard_bytes)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    if max_shard_bytes == 1_000_000:
        assert len(shards) > 1
        assert shards[0] == f"diffusion_pytorch_model-00001-of-{len(shards):05d}.safetensors"
        index = json.loads((out / INDEX_FILE).read_text())
        assert set(index["weight_map"]) == set(reference.state_dict())
    else:
        assert shards == [WEIGHTS_FILE]
    back = diffusers.AutoencoderKL.from_pretrained(out).eval()
    _assert_same_outputs(model, back)
    _assert_same_outputs(load_flux_autoencoder(out), reference)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_export_in_bfloat16_loads_in_bfloat16(saved: Path, tmp_path: Path) -> None:
    model = load_flux_autoencoder(saved)
    out = save_flux_autoencoder(model, tmp_path / "bf16", dtype=torch.bfloat16, max_shard_bytes="10MB")
    assert {t.dtype for t in load_file(out / WEIGHTS_FILE).values()} == {torch.bfloat16}
    loaded = load_flux_autoencoder(out)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    assert next(load_flux_autoencoder(out, dtype=torch.float32).parameters()).dtype == torch.float32


def _rewrite(saved: Path, tmp_path: Path, edit) -> Path:
    """A copy of ``saved`` whose tensors went through ``edit``."""
    copy = tmp_path / "edited"
    copy.mkdir()
    (copy / "config.json").write_bytes((saved / "config.json").read_bytes())
    tensors = load_file(saved / WEIGHTS_FILE)
    edit(tensors)
    save_file(tensors, str(copy / WEIGHTS_FILE), metadata={"format": "pt"})
    return copy


def test_missing_tensor_is_named(saved: Path, tmp_path: Path) -> None:
    copy = _rewrite(saved, tmp_path, lambda t: t.pop("decoder.mid_block.attentions.0.to_k.bias"))
    with pytest.raises(CheckpointMismatchError, match=r"missing: decoder\.mid_block\.attentions\.0\.to_k\.bias"):
        load_flux_autoencoder(copy)


def test_unexpected_tensor_is_named(saved: Path, tmp_path: Path) -> None:
    copy = _rewrite(saved, tmp_path, lambda t: t.update({"quant_conv.weight": torch.zeros(32, 32, 1, 1)}))
    with pytest.raises(CheckpointMismatchError, match=r"unexpected: quant_conv\.weight"):
        load_flux_autoencoder(copy)


def test_mis_shaped_tensor_is_named(saved: Path, tmp_path: Path) -> None:
    name = "encoder.down_blocks.1.resnets.0.conv_shortcut.weight"
    copy = _rewrite(saved, tmp_path, lambda t: t.update({name: torch.zeros(64, 32, 3, 3)}))
    with pytest.raises(CheckpointMismatchError, match=rf"mis-shaped: {name.replace('.', r'.')}.*\(64, 32, 3, 3\)"):
        load_flux_autoencoder(copy)


def test_unsupported_config_is_refused_before_reading_weights(saved: Path, tmp_path: Path) -> None:
    copy = tmp_path / "quant"
    copy.mkdir()
    config = json.loads((saved / "config.json").read_text())
    config["use_quant_conv"] = True
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedAutoencoderConfigError, match="use_quant_conv"):
        load_flux_autoencoder(copy)


def test_pickles_are_never_read(saved: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pickled"
    copy.mkdir()
    (copy / "config.json").write_bytes((saved / "config.json").read_bytes())
    (copy / "diffusion_pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="safetensors only"):
        load_flux_autoencoder(copy)


def test_debug_flavor_round_trips_exactly(tmp_path: Path) -> None:
    model = build_flux_autoencoder("debug")
    model.to_empty(device="cpu")
    model.init_weights(7)
    loaded = load_flux_autoencoder(save_flux_autoencoder(model, tmp_path / "debug"))
    assert loaded.args == model.args
    for (name, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters(), strict=True):
        assert torch.equal(a, b), name
