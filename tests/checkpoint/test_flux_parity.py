"""FLUX.1 transformer parity with diffusers' FluxTransformer2DModel, through its own checkpoints.

A tiny random ``FluxTransformer2DModel`` (with and without the guidance embedder) is saved
by ``save_pretrained`` (one file, and sharded), loaded by titanpod, and run on the same
random inputs. Measured on a 2-core CPU in fp32: forward max abs difference 0.0 (outputs up
to 12.7); backward (gradients of the image, text and pooled inputs and of every parameter)
max abs difference 3.7e-5 with gradients up to 175 (2e-7 relative). The tests allow 1e-4,
for gradients 1e-4 x the tensor's largest gradient (at least 1e-4). titanpod's export loads
back into ``FluxTransformer2DModel.from_pretrained`` with the same outputs, and broken
checkpoints fail with errors that name the tensor or key.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from titanpod.checkpoint.errors import CheckpointMismatchError
from titanpod.checkpoint.flux_files import (
    DIFFUSERS_INDEX_FILE,
    DIFFUSERS_SINGLE_FILE,
    load_flux_transformer,
    read_flux_config,
    save_flux_transformer,
)
from titanpod.models.adapters.base import UnsupportedConfigError
from titanpod.models.adapters.flux_transformer import (
    flux_args_from_hf_config,
    flux_hf_config_from_args,
    flux_hf_layout,
)
from titanpod.models.flux import FLUX_FLAVORS, FluxArgs, build_flux_transformer

diffusers = pytest.importorskip("diffusers")

TOLERANCE = 1e-4
SHAPE = {
    "in_channels": 16,
    "num_layers": 2,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 24,
    "pooled_projection_dim": 12,
    "axes_dims_rope": (4, 6, 6),
}
B, T, ROWS, COLS = 2, 5, 3, 4
SMALL_SHARDS = "20KB"  # about 30 shards for the tiny model


def diffusers_model(guidance: bool, seed: int = 0):
    """A tiny FluxTransformer2DModel whose every parameter (norm scales too) is random."""
    torch.manual_seed(seed)
    model = diffusers.FluxTransformer2DModel(**SHAPE, guidance_embeds=guidance).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param) * 0.2)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[bool, bool], tuple[object, Path]]:
    """(guidance, sharded) -> (diffusers model, the folder ``save_pretrained`` wrote)."""
    root = tmp_path_factory.mktemp("flux")
    folders = {}
    for guidance in (True, False):
        model = diffusers_model(guidance)
        for sharded in (True, False):
            folder = root / f"guidance{int(guidance)}-sharded{int(sharded)}"
            model.save_pretrained(folder, safe_serialization=True, max_shard_size=SMALL_SHARDS if sharded else "1GB")
            folders[guidance, sharded] = (model, folder)
    return folders


def random_inputs(guidance: bool, seed: int = 1) -> dict[str, torch.Tensor | None]:
    generator = torch.Generator().manual_seed(seed)
    rows, cols = torch.meshgrid(torch.arange(ROWS), torch.arange(COLS), indexing="ij")
    img_ids = torch.stack((torch.zeros_like(rows), rows, cols), dim=-1).reshape(-1, 3).float()
    return {
        "img": torch.randn(B, ROWS * COLS, SHAPE["in_channels"], generator=generator),
        "img_ids": img_ids,
        "txt": torch.randn(B, T, SHAPE["joint_attention_dim"], generator=generator),
        "txt_ids": torch.zeros(T, 3),
        "t": torch.rand(B, generator=generator),
        "pooled": torch.randn(B, SHAPE["pooled_projection_dim"], generator=generator),
        "guidance": torch.tensor([3.5, 1.0]) if guidance else None,
    }


def run_diffusers(model, x: dict) -> torch.Tensor:
    return model(
        hidden_states=x["img"],
        encoder_hidden_states=x["txt"],
        pooled_projections=x["pooled"],
        timestep=x["t"],
        img_ids=x["img_ids"],
        txt_ids=x["txt_ids"],
        guidance=x["guidance"],
    ).sample


def run_titanpod(model, x: dict) -> torch.Tensor:
    return model(x["img"], x["img_ids"], x["txt"], x["txt_ids"], x["t"], x["pooled"], x["guidance"])


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "single-file"])
@pytest.mark.parametrize("guidance", [True, False], ids=["dev-like", "schnell-like"])
def test_forward_matches_diffusers(saved, guidance, sharded):
    reference, folder = saved[guidance, sharded]
    if sharded:
        assert (folder / DIFFUSERS_INDEX_FILE).is_file()
    model = load_flux_transformer(folder)
    assert model.args.guidance_embed is guidance
    x = random_inputs(guidance)
    with torch.no_grad():
        expected, ours = run_diffusers(reference, x), run_titanpod(model, x)
    assert expected.abs().max() > 1.0  # the comparison means something
    assert max_diff(ours, expected) <= TOLERANCE


@pytest.mark.parametrize("guidance", [True, False], ids=["dev-like", "schnell-like"])
def test_backward_matches_diffusers(saved, guidance):
    reference, folder = saved[guidance, True]
    model = load_flux_transformer(folder)
    x = random_inputs(guidance)
    weight = torch.randn(B, ROWS * COLS, SHAPE["in_channels"], generator=torch.Generator().manual_seed(7))
    grads = {}
    for name, run, net in (("diffusers", run_diffusers, reference), ("titanpod", run_titanpod, model)):
        net.zero_grad()
        leaves = {k: x[k].clone().requires_grad_() for k in ("img", "txt", "pooled")}
        (run(net, {**x, **leaves}) * weight).sum().backward()
        grads[name] = {k: v.grad for k, v in leaves.items()}
    theirs_params = dict(reference.named_parameters())
    ours_params = dict(model.named_parameters())
    for hf_name, slot in flux_hf_layout(model.args).items():
        ours = ours_params[slot.name].grad
        grads["titanpod"][hf_name] = ours if slot.rows is None else ours[slot.rows[0] : slot.rows[1]]
        grads["diffusers"][hf_name] = theirs_params[hf_name].grad
    assert len(grads["titanpod"]) == 3 + len(theirs_params)
    for key, expected in grads["diffusers"].items():
        allowed = TOLERANCE * max(1.0, expected.abs().max().item())
        assert max_diff(grads["titanpod"][key], expected) <= allowed, key


@pytest.mark.parametrize("guidance", [True, False], ids=["dev-like", "schnell-like"])
def test_export_loads_back_into_diffusers(saved, guidance, tmp_path):
    reference, folder = saved[guidance, False]
    model = load_flux_transformer(folder)
    out = save_flux_transformer(model, tmp_path / "export", max_shard_bytes=SMALL_SHARDS)
    index = json.loads((out / DIFFUSERS_INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert set(index["weight_map"]) == set(reference.state_dict())
    back = diffusers.FluxTransformer2DModel.from_pretrained(out, low_cpu_mem_usage=False).eval()
    assert dict(back.config)["guidance_embeds"] is guidance
    x = random_inputs(guidance)
    with torch.no_grad():
        assert max_diff(run_diffusers(back, x), run_diffusers(reference, x)) <= TOLERANCE
    # And back into titanpod, single file this time.
    again = load_flux_transformer(save_flux_transformer(model, tmp_path / "single"))
    assert (tmp_path / "single" / DIFFUSERS_SINGLE_FILE).is_file()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters(), strict=True))


def test_export_in_bfloat16_reads_back_in_bfloat16(saved, tmp_path):
    model = load_flux_transformer(saved[True, False][1])
    again = load_flux_transformer(save_flux_transformer(model, tmp_path / "bf16", dtype=torch.bfloat16))
    assert {p.dtype for p in again.parameters()} == {torch.bfloat16}
    assert all(torch.equal(p.bfloat16(), q) for p, q in zip(model.parameters(), again.parameters(), strict=True))
    assert load_flux_transformer(tmp_path / "bf16", dtype="float32").img_in.weight.dtype == torch.float32


@pytest.fixture
def sharded_copy(saved, tmp_path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(saved[True, True][1], folder)
    return folder


def rewrite_shard_holding(folder: Path, name: str, change) -> Path:
    index_path = folder / DIFFUSERS_INDEX_FILE
    index = json.loads(index_path.read_text())
    shard = folder / index["weight_map"][name]
    tensors = load_file(str(shard))
    change(tensors, index["weight_map"])
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))
    return shard


def test_missing_tensor_is_named(sharded_copy):
    name = "single_transformer_blocks.1.attn.to_k.weight"
    rewrite_shard_holding(sharded_copy, name, lambda tensors, weight_map: (tensors.pop(name), weight_map.pop(name)))
    with pytest.raises(CheckpointMismatchError, match=rf"missing: {name} \(titanpod single_blocks\.1\.linear1\.weight"):
        load_flux_transformer(sharded_copy)


def test_extra_tensor_is_named(sharded_copy):
    name = "x_embedder.weight"
    extra = "transformer_blocks.0.attn.to_qkv.weight"

    def add(tensors, weight_map):
        tensors[extra] = torch.zeros(3)
        weight_map[extra] = weight_map[name]

    shard = rewrite_shard_holding(sharded_copy, name, add)
    with pytest.raises(CheckpointMismatchError, match=rf"unexpected: {extra} \(in {shard.name}\)"):
        load_flux_transformer(sharded_copy)


def test_wrong_shape_is_named_with_both_shapes(sharded_copy):
    name = "transformer_blocks.1.ff_context.net.0.proj.weight"

    def shrink(tensors, weight_map):
        tensors[name] = tensors[name][:-1].contiguous()

    shard = rewrite_shard_holding(sharded_copy, name, shrink)
    with pytest.raises(CheckpointMismatchError) as caught:
        load_flux_transformer(sharded_copy)
    assert f"mis-shaped: {name} (in {shard.name}) is (127, 32), the model expects (128, 32)" in str(caught.value)


def test_tensor_listed_in_the_index_but_absent_from_its_shard_is_named(sharded_copy):
    name = "norm_out.linear.bias"
    rewrite_shard_holding(sharded_copy, name, lambda tensors, weight_map: tensors.pop(name))
    with pytest.raises(CheckpointMismatchError, match=rf"missing: {name} is listed for"):
        load_flux_transformer(sharded_copy)


def test_config_errors_name_the_key(sharded_copy):
    config_path = sharded_copy / "config.json"
    config = json.loads(config_path.read_text())
    assert read_flux_config(sharded_copy).guidance_embed
    for change, key in (
        ({"patch_size": 2}, "patch_size=2"),
        ({"qk_norm": "layer_norm"}, "qk_norm"),
        ({"axes_dims_rope": [4, 6, 8]}, "axes_dims_rope"),
        ({"num_layers": "two"}, "num_layers"),
        ({"_class_name": "SD3Transformer2DModel"}, "SD3Transformer2DModel"),
    ):
        config_path.write_text(json.dumps({**config, **change}))
        with pytest.raises(UnsupportedConfigError, match=key) as caught:
            load_flux_transformer(sharded_copy)
        assert "config.json" in str(caught.value)


def test_published_configs_without_optional_keys_read_as_the_flavors():
    """FLUX.1 dev's transformer/config.json as published (no axes_dims_rope, no out_channels)."""
    published = {
        "_class_name": "FluxTransformer2DModel",
        "_diffusers_version": "0.30.0.dev0",
        "attention_head_dim": 128,
        "guidance_embeds": True,
        "in_channels": 64,
        "joint_attention_dim": 4096,
        "num_attention_heads": 24,
        "num_layers": 19,
        "num_single_layers": 38,
        "patch_size": 1,
        "pooled_projection_dim": 768,
    }
    assert flux_args_from_hf_config(published) == FLUX_FLAVORS["dev"]
    assert flux_args_from_hf_config({**published, "guidance_embeds": False}) == FLUX_FLAVORS["schnell"]
    for args in FLUX_FLAVORS.values():
        assert flux_args_from_hf_config(flux_hf_config_from_args(args)) == args


def test_args_diffusers_cannot_hold_are_refused_before_writing(tmp_path):
    model = build_flux_transformer(FluxArgs(**{**vars(FLUX_FLAVORS["debug"]), "mlp_ratio": 2.0}), device="cpu")
    with pytest.raises(UnsupportedConfigError, match="mlp_ratio"):
        save_flux_transformer(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_pickled_weights_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "FluxTransformer2DModel"}))
    (tmp_path / "diffusion_pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="pickled weights"):
        load_flux_transformer(tmp_path)
