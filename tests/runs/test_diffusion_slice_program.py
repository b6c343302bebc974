"""The FLUX step ``titanpod-diffusion --compile-for`` compiles, as far as it is built without libtpu: copies cut
in FLUX's proportion of blocks, the abstract batch against a real one, the model's flops and the planner's bytes
beside the compiler's, and the errors a bad request gets before any compile."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.runs.test_diffusion_training import batches_of, small_recipe
from titanpod.device.tpu_slices import slice_of
from titanpod.models.flux import FLUX_FLAVORS, flux_flops_per_sample
from titanpod.recipes.diffusion.registry import get_diffusion_recipe
from titanpod.recipes.planner.flux import plan_flux
from titanpod.recipes.planner.report import target_chip
from titanpod.runs.diffusion.batches import EncodingCache, flow_matching_batch_shape
from titanpod.runs.diffusion.components import build_diffusion_models
from titanpod.runs.diffusion.slice_compile import block_unit, cost_depths, cut_args, diffusion_program

V5P_16 = slice_of("v5p", 8)
"""flux1_12b's slice: 8 v5p chips."""


def test_copies_keep_flux_proportion_of_blocks():
    dev = FLUX_FLAVORS["dev"]
    assert block_unit(dev) == 3 and cost_depths(get_diffusion_recipe("flux1_12b")) == (3, 6)
    six = cut_args(dev, 6)
    assert (six.depth, six.depth_single) == (2, 4) and six.dim == dev.dim
    assert cut_args(dev, None) == dev
    with pytest.raises(ValueError, match=r"--compile-layers 4: .* multiple of 3 blocks \(e\.g\. --compile-layers 3 6"):
        cut_args(dev, 4)
    with pytest.raises(ValueError, match="drop --compile-layers"):
        cut_args(dataclasses.replace(dev, depth=2, depth_single=3), 5)


def test_the_abstract_batch_is_the_batch_a_run_makes():
    recipe = small_recipe()
    models = build_diffusion_models(recipe, torch.device("cpu"))
    batch = next(batches_of(recipe, models, EncodingCache(None)))
    args = models.transformer.args
    shape = flow_matching_batch_shape(4, args, batch["latents"].shape[1], batch["text"].shape[1], micro_batches=2)
    assert shape.micro_batches == 2 and shape.batch == 4
    assert shape.shapes == {name: tuple(tensor.shape) for name, tensor in batch.items()}
    assert shape.dtypes == {name: str(tensor.dtype).removeprefix("torch.") for name, tensor in batch.items()}


def test_flux1_12b_program_on_its_slice():
    recipe = get_diffusion_recipe("flux1_12b")
    program = diffusion_program(recipe, V5P_16)
    assert program.axes["fsdp"] == 8 and program.layers == program.model_layers == 57
    assert program.train.scan_layers and program.train.memory_policy == "recompute"
    assert program.images_per_step == 8 and program.tokens_per_step == 8 * 4096
    assert program.batch.shapes["latents"] == (8, 4096, 64) and program.batch.shapes["text"] == (8, 512, 4096)
    assert program.batch.shapes["img_ids"] == (4096, 3) and "guidance" in program.batch.shapes  # dev: guidance
    # one image a chip: the model's flops a chip are one sample's (223.2 TFLOP at 1024 px)
    per_image = flux_flops_per_sample(FLUX_FLAVORS["dev"], 4096, 512)
    assert program.model_flops_per_chip == pytest.approx(per_image) and 2.2e14 < per_image < 2.25e14
    xla = dataclasses.replace(recipe, device=dataclasses.replace(recipe.device, lane="xla"))
    assert program.planner_bytes == plan_flux(xla, target_chip("v5p"), 8, recipe.target.mfu).memory.total
    assert sum(p.numel() for p in program.model.parameters()) == 11_901_408_320  # on meta: nothing allocated
    assert all(p.is_meta for p in program.model.parameters())


def test_cut_copies_grow_linearly_with_depth():
    """What extrapolation by depth relies on, for the figures this side computes: the model's flops and the
    planner's bytes of copies of 3, 6 and 9 blocks rise by equal steps, and the copies are unrolled."""
    recipe = get_diffusion_recipe("flux1_12b")
    three, six, nine = (diffusion_program(recipe, V5P_16, blocks) for blocks in (3, 6, 9))
    assert [p.layers for p in (three, six, nine)] == [3, 6, 9] and not six.train.scan_layers
    assert nine.model_flops_per_chip - six.model_flops_per_chip == pytest.approx(
        six.model_flops_per_chip - three.model_flops_per_chip
    )
    assert nine.planner_bytes - six.planner_bytes == pytest.approx(six.planner_bytes - three.planner_bytes, rel=1e-3)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--compile-for", "v5p-7"], "v5p-7"),
        (["--compile-for", "target", "--compile-layers", "4"], "--compile-layers 4"),
        (["--compile-for", "target", "--compile-layers", "6", "3"], "two rising"),
    ],
)
def test_bad_requests_exit_2_before_any_compile(flags, message, tmp_path, capsys):
    from titanpod.diffusion.cli import main

    code = main(["--recipe", "flux1_12b", *flags, "--compile-output", str(tmp_path / "out")])
    assert code == 2
    assert message in " ".join(capsys.readouterr().err.split())
