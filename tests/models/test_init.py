"""The canonical initialisation: any region drawn alone equals that region of the whole, bit for bit;
regions draw only the tiles they meet; the laws (truncated normal, residual scaling, ones, zeros) hold."""

from __future__ import annotations

import math
import random

import pytest
import torch

from titanpod.models import ParamInit, region_initializer
from titanpod.models.common import init as init_module
from titanpod.models.common.init import (
    TILE_ELEMENTS,
    fill_region_,
    region_values,
    tile_shape,
    whole_region,
)
from titanpod.models.flux import FLUX_FLAVORS, build_flux_transformer
from titanpod.recipes.families import build_model

SHAPES = [(), (5,), (70_000,), (300, 700), (1000, 40), (3, 200, 96), (6, 300, 7), (2, 3, 4, 5)]
"""Scalars, vectors longer than a tile, matrices of several tiles each way, 3-D (experts) and 4-D."""


def _random_region(shape: tuple[int, ...], rng: random.Random) -> tuple[slice, ...]:
    region = []
    for size in shape:
        start = rng.randint(0, size)
        region.append(slice(start, rng.randint(start, size)))
    return tuple(region)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_any_region_equals_that_region_of_the_whole(shape):
    law = ParamInit("normal", std=0.5)
    whole = region_values(law, "w", 11, shape, whole_region(shape))
    rng = random.Random(0)
    for _ in range(12):
        region = _random_region(shape, rng)
        assert torch.equal(region_values(law, "w", 11, shape, region), whole[region]), region


def test_shards_of_every_split_put_back_together_give_the_whole():
    """Row shards, column shards and a 2 x 3 grid of an uneven matrix concatenate to the whole."""
    shape, law = (1030, 530), ParamInit("normal", std=1.0)
    whole = region_values(law, "layers.0.attention.wq.weight", 5, shape, whole_region(shape))
    rows = [region_values(law, "layers.0.attention.wq.weight", 5, shape, (slice(a, b), slice(0, 530)))
            for a, b in ((0, 257), (257, 700), (700, 1030))]  # fmt: skip
    assert torch.equal(torch.cat(rows), whole)
    columns = [region_values(law, "layers.0.attention.wq.weight", 5, shape, (slice(0, 1030), slice(a, b)))
               for a, b in ((0, 1), (1, 300), (300, 530))]  # fmt: skip
    assert torch.equal(torch.cat(columns, dim=1), whole)
    grid = [[region_values(law, "layers.0.attention.wq.weight", 5, shape, (slice(r, r + 515), slice(c, c + 177)))
             for c in (0, 177, 354)] for r in (0, 515)]  # fmt: skip
    assert torch.equal(torch.cat([torch.cat(row, dim=1) for row in grid]), whole[:, :531])


def test_a_region_draws_only_the_tiles_it_meets(monkeypatch):
    """A column shard of a 1024 x 1024 matrix draws one tile column; a 3-D expert's shard only its experts."""
    drawn: list[tuple[int, int]] = []
    seed_of = init_module.tile_seed
    monkeypatch.setattr(init_module, "tile_seed", lambda s, n, r, c: drawn.append((r, c)) or seed_of(s, n, r, c))
    law = ParamInit("normal")
    rows, columns = tile_shape((1024, 1024))[:2]
    region_values(law, "w", 0, (1024, 1024), (slice(0, 1024), slice(3 * columns, 3 * columns + 32)))
    assert sorted(drawn) == [(row, 3) for row in range(1024 // rows)]
    drawn.clear()
    assert tile_shape((8, 256, 512)) == (1, 256, 512)  # one expert's rows make a tile
    region_values(law, "experts", 0, (8, 256, 512), (slice(4, 6), slice(0, 256), slice(0, 512)))
    assert sorted(drawn) == [(4, 0), (5, 0)]


@pytest.mark.parametrize("shape", [(128256, 2048), (8192, 8192), (128, 4096, 1536), (16384,), (7, 3)], ids=str)
def test_tiles_stay_near_their_size(shape):
    tile = tile_shape(shape)
    assert len(tile) == len(shape) and all(1 <= t <= s for t, s in zip(tile, shape, strict=True))
    assert math.prod(tile) <= max(TILE_ELEMENTS, math.prod(shape[1:2]) * math.prod(shape[2:]))


def test_names_seeds_and_tiles_give_different_values():
    law, shape = ParamInit("normal"), (300, 300)
    a = region_values(law, "layers.0.w", 0, shape, whole_region(shape))
    assert not torch.equal(a, region_values(law, "layers.1.w", 0, shape, whole_region(shape)))
    assert not torch.equal(a, region_values(law, "layers.0.w", 1, shape, whole_region(shape)))
    rows, columns = tile_shape(shape)
    assert not torch.equal(a[:rows, :columns], a[rows : 2 * rows, :columns])


def test_the_law_truncated_normal_ones_and_zeros():
    values = region_values(ParamInit("normal", std=0.02), "w", 0, (1000, 1000), whole_region((1000, 1000)))
    assert values.mean().abs() < 1e-4
    assert values.std().item() == pytest.approx(0.02, rel=0.01)  # clamping at 3 std barely changes it
    assert values.abs().max().item() == pytest.approx(0.06)
    assert 0.001 < (values.abs() == 0.06).float().mean() < 0.004  # the 0.27% beyond 3 std, clamped
    assert torch.equal(region_values(ParamInit("ones"), "n", 0, (7,), (slice(2, 5),)), torch.ones(3))
    assert torch.equal(region_values(ParamInit("zeros"), "b", 0, (7, 2), whole_region((7, 2))), torch.zeros(7, 2))


def test_a_region_of_the_wrong_shape_is_named():
    with pytest.raises(ValueError, match="the region"):
        fill_region_(torch.empty(3, 3), ParamInit("normal"), "w", 0, (8, 8), (slice(0, 4), slice(0, 3)))
    with pytest.raises(ValueError, match="has 1 dimensions; the parameter has 2"):
        region_values(ParamInit("normal"), "w", 0, (8, 8), (slice(0, 4),))


@pytest.mark.parametrize("family", ["llama3", "qwen3", "qwen3_moe"])
def test_decoder_init_weights_is_the_region_init_and_keeps_its_laws(family):
    model = build_model(family, "debug", device="cpu")
    model.init_weights(4)
    values = region_initializer(build_model(family, "debug"), 4)  # from the meta model's shapes
    residual_std = 0.02 / math.sqrt(2 * model.args.n_layers)
    for name, param in model.named_parameters():
        assert torch.equal(param, values(name, whole_region(param.shape))), name
        if name.endswith("norm.weight"):
            assert torch.all(param == 1), name
        elif name.endswith(("wo.weight", "w2.weight", "experts.w2")):
            assert param.abs().max().item() == pytest.approx(3 * residual_std), name
        else:
            assert param.abs().max().item() == pytest.approx(0.06), name


def test_init_weights_is_the_same_in_bf16_and_on_the_meta_then_cpu_path():
    fp32 = build_model("llama3", "debug", device="cpu")
    fp32.init_weights(9)
    moved = build_model("llama3", "debug").to_empty(device="cpu")
    moved.init_weights(9)
    bf16 = build_model("llama3", "debug", device="cpu").to(torch.bfloat16)
    bf16.init_weights(9)
    for (name, a), b, c in zip(fp32.named_parameters(), moved.parameters(), bf16.parameters(), strict=True):
        assert torch.equal(a, b), name
        assert torch.equal(a.to(torch.bfloat16), c), name


def test_flux_init_weights_is_the_region_init():
    model = build_flux_transformer("debug", device="cpu")
    model.init_weights(2)
    values = region_initializer(build_flux_transformer(FLUX_FLAVORS["debug"]), 2)
    for name, param in model.named_parameters():
        assert torch.equal(param, values(name, whole_region(param.shape))), name
    state = model.state_dict()
    assert torch.all(state["final_layer.linear.weight"] == 0) and torch.all(state["double_blocks.0.img_mod.bias"] == 0)


def test_unknown_parameter_is_named():
    values = region_initializer(build_model("llama3", "debug"), 0)
    with pytest.raises(KeyError, match=r"no parameter 'layers\.99\.w'"):
        values("layers.99.w", (slice(0, 1),))
