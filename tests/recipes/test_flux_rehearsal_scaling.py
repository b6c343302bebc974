"""Scaling flux1_12b for its rehearsal: every setting kept, scaled with its new value shown, or refused by name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from titanpod.models.flux.text_encoders import FluxTextEncoders
from titanpod.recipes.diffusion.recipe import DiffusionRecipe
from titanpod.recipes.diffusion.registry import get_diffusion_recipe
from titanpod.recipes.rehearsal.diffusion import (
    SMALL_MODEL_LR,
    DiffusionMaterials,
    check_diffusion_honourable,
    scale_diffusion_recipe,
)
from titanpod.recipes.rehearsal.flux_materials import IMAGES, write_image_folder, write_pipeline_folder
from titanpod.recipes.rehearsal.scaling import STEPS, STOP_AT, RehearsalError, rehearsal_lanes
from titanpod.runs.diffusion.components import build_diffusion_models

MATERIALS = DiffusionMaterials.under(Path("/nonexistent"))


def scaled(lane: str, recipe: DiffusionRecipe | None = None):
    return scale_diffusion_recipe(
        recipe or get_diffusion_recipe("flux1_12b"), lane, Path("/nonexistent/runs"), MATERIALS
    )


@pytest.mark.parametrize("lane", ["cpu", "xla"])
def test_every_setting_is_a_row_and_the_transformer_keeps_its_structure(lane):
    recipe = get_diffusion_recipe("flux1_12b")
    small, rows = scaled(lane)
    table = {row.name: row for row in rows}
    assert len(table) == len(rows)  # one row a setting
    # The small transformer: double and single blocks in the flavor's 1:2, the rotary split and text widths kept.
    for feature in ("model.double : single blocks", "model.axes_dims as parts of head_dim", "model.context_dim / dim",
                    "model.pooled_dim / dim", "model.guidance_embed", "model.mlp_ratio", "model.qkv_bias"):  # fmt: skip
        assert table[feature].kept, feature
    args = small.model.args()
    assert (args.depth, args.depth_single) == (1, 2) and args.guidance_embed
    assert args.n_heads * args.head_dim == args.dim and sum(args.axes_dims) == args.head_dim
    assert table["model.dim"].recipe == "3072" and table["model.dim"].rehearsal == str(args.dim)
    # The plan: FSDP over all the rest of the lane's devices, dtypes and precision as written.
    executor = "torch executor, gloo processes" if lane == "cpu" else "XLA SPMD, host devices"
    assert table["parallel.fsdp"].recipe == "all the rest"
    assert table["parallel.fsdp"].rehearsal == f"{4 if lane == 'cpu' else 8} ({executor})"
    for kept in ("parallel.param_dtype", "parallel.reduce_dtype", "train.precision", "train.memory_policy",
                 "train.decay", "data.source", "data.batch_size", "data.caption_dropout",
                 "samples.cfg_scale"):  # fmt: skip
        assert table[kept].kept, kept
    assert table["train.steps"].rehearsal == f"{STEPS} (stop at {STOP_AT} with a checkpoint, resume)"
    assert small.train.lr == SMALL_MODEL_LR and table["train.lr"].recipe == "1e-05"
    assert small.data.resolution == 64 and small.data.path == str(MATERIALS.images)
    assert small.model.autoencoder == str(MATERIALS.pipeline / "vae")
    assert small.model.text_encoders == str(MATERIALS.pipeline)
    assert 0 < small.samples.every <= STEPS and small.checkpoint.every == STOP_AT
    assert table["device.lane"].rehearsal == lane
    assert recipe.train.step_mode == "whole_step" and recipe.train.scan_layers  # as the pod runs it
    for kept in ("train.step_mode", "train.scan_layers"):
        assert table[kept].kept and table[kept].rehearsal == table[kept].recipe, kept
    # Every setting of the recipe is accounted for (outputs go to the rehearsal's own folder).
    assert recipe.to_dict().keys() == small.to_dict().keys()


def test_a_setting_the_rehearsal_does_not_know_is_refused_by_name():
    extended = dataclasses.make_dataclass("Extended", [("cache_policy", str, "warm")], bases=(DiffusionRecipe,),
                                          frozen=True)  # fmt: skip
    recipe = extended(**{f.name: getattr(get_diffusion_recipe("flux1_12b"), f.name)
                         for f in dataclasses.fields(DiffusionRecipe)})  # fmt: skip
    with pytest.raises(RehearsalError, match=r"^cache_policy: the FLUX rehearsal does not know this setting"):
        check_diffusion_honourable(recipe, ("cpu", "xla"))


@pytest.mark.parametrize("lane", ["cpu", "xla"])
def test_kernel_choices_and_tensor_parallelism_are_rehearsed_like_the_language_models(lane):
    data = get_diffusion_recipe("flux1_12b").to_dict()
    data["parallel"]["tp"] = 2
    recipe = DiffusionRecipe.from_dict(data)
    check_diffusion_honourable(recipe, (lane,))
    small, rows = scaled(lane, recipe)
    table = {row.name: row for row in rows}
    assert small.kernels.attention == "splash"
    assert table["kernels.attention"].rehearsal == "splash (Pallas interpret mode)"
    assert table["kernels.splash.block_q"].recipe == "512" and small.kernels.splash.block_q == 128
    assert table["parallel.tp"].rehearsal.startswith("2 ") and table["parallel.fsdp"].rehearsal.startswith(
        "2 " if lane == "cpu" else "4 "
    )
    assert small.model.args().n_heads % 2 == 0  # whole heads on each tp rank


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"train": {"memory_policy": "offload", "step_mode": "whole_step"}}, "train.memory_policy 'offload'"),
        ({"parallel": {"cp": 2}}, "does not split sequences over ranks: set parallel.cp to 1"),
        ({"parallel": {"pp": 2}}, "does not train with pipeline stages: set parallel.pp to 1"),
        ({"model": {"transformer_weights": "/weights"}}, "model.transformer_weights '/weights'"),
        ({"data": {"source": "hub", "path": "user/images"}}, "data.source 'hub' (user/images)"),
        ({"model": {"recompute_blocks": True}}, "lane: model.recompute_blocks"),  # whole_step recomputes already
    ],
)
def test_settings_this_machine_cannot_honour_are_named(overrides, named, tmp_path):
    from titanpod.runs.rehearsal.diffusion import rehearse_diffusion

    data = get_diffusion_recipe("flux1_12b").to_dict()
    for section, values in overrides.items():
        data[section].update(values)
    recipe = DiffusionRecipe.from_dict(data)
    folder = tmp_path / "rehearsal"
    with pytest.raises(RehearsalError) as refused:
        rehearse_diffusion(recipe, folder, console=None, lanes=rehearsal_lanes(recipe))  # type: ignore[arg-type]
    assert named in str(refused.value)
    assert not folder.exists()  # refused before anything was written


def test_the_stand_ins_load_through_the_published_layouts(tmp_path):
    small, _ = scale_diffusion_recipe(get_diffusion_recipe("flux1_12b"), "cpu", tmp_path / "runs",
                                      DiffusionMaterials.under(tmp_path))  # fmt: skip
    args = small.model.args()
    write_image_folder(tmp_path / "images", small.data.resolution, seed=0)
    write_pipeline_folder(tmp_path / "FLUX.1-dev", args.context_dim, args.pooled_dim, seed=0)
    rows = [json.loads(line) for line in (tmp_path / "images" / "metadata.jsonl").read_text().splitlines()]
    assert len(rows) == IMAGES and all((tmp_path / "images" / row["file_name"]).is_file() for row in rows)
    encoders = FluxTextEncoders.from_pretrained(tmp_path / "FLUX.1-dev")
    assert (encoders.context_dim, encoders.pooled_dim, encoders.t5_max_length) == (
        args.context_dim,
        args.pooled_dim,
        512,
    )
    models = build_diffusion_models(small, torch.device("cpu"))
    latents = models.codec.encode(torch.zeros(1, 3, small.data.resolution, small.data.resolution))
    assert latents.shape == (1, 16, small.data.resolution // 8, small.data.resolution // 8)
    assert models.transformer.args.in_channels == 64 and models.transformer.args.dim == args.dim
