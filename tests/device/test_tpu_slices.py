"""TPU slice names: accelerator types to chips and the torus libtpu is asked for."""

from __future__ import annotations

import pytest

from titanpod.device.tpu_slices import TpuSlice, host_bounds, parse_slice, slice_of, torus_shape


@pytest.mark.parametrize(
    ("name", "chip", "chips", "topology"),
    [
        ("v5p-8", "v5p", 4, "v5p:2x2x1"),
        ("v5p-16", "v5p", 8, "v5p:2x2x2"),
        ("v5p-512", "v5p", 256, "v5p:4x8x8"),
        ("v5p-1024", "v5p", 512, "v5p:8x8x8"),
        ("v4-32", "v4", 16, "v4:2x2x4"),
        ("v6e-64", "v6e", 64, "v6e:8x8"),
        ("v6e-256", "v6e", 256, "v6e:16x16"),
        ("v6e-8", "v6e", 8, "v6e:2x4"),
        ("v5litepod-16", "v5e", 16, "v5e:4x4"),
        ("v5litepod-1", "v5e", 1, "v5e:1x1"),
        ("v5litepod-4", "v5e", 4, "v5e:2x2"),
        ("v6e-1", "v6e", 1, "v6e:1x1"),
    ],
)
def test_accelerator_types_name_chips_and_torus(name: str, chip: str, chips: int, topology: str) -> None:
    tpu = parse_slice(name)
    assert (tpu.chip, tpu.chips, tpu.num_slices) == (chip, chips, 1)
    assert tpu.topology_name() == topology
    assert tpu.name == name  # the name round-trips
    assert slice_of(chip, chips) == tpu


def test_several_slices() -> None:
    tpu = parse_slice("2 x v5p-256")
    assert tpu == TpuSlice("v5p", 128, 2)
    assert tpu.total_chips == 256
    assert tpu.name == "2 x v5p-256"


@pytest.mark.parametrize(
    ("name", "says"),
    [("v5p8", "not a TPU slice name"), ("h100-8", "not a TPU slice name"), ("v5p-7", "even"), ("v6e-24", "power")],
)
def test_bad_names_say_what_is_accepted(name: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_slice(name)


def test_a_torus_holds_every_chip() -> None:
    for chip in ("v5p", "v6e"):
        for power in range(2, 9):
            shape = torus_shape(chip, 2**power)
            product = 1
            for side in shape:
                product *= side
            assert product == 2**power
            assert max(shape) <= 2 * min(shape) or 1 in shape


def test_a_gpu_is_no_tpu_target() -> None:
    with pytest.raises(ValueError, match="not a TPU"):
        slice_of("h100", 8)


@pytest.mark.parametrize(
    ("name", "bounds"),
    [
        ("v5e-1", (1, 1, 1)),  # one chip: libtpu refuses v5e:1x1 with a 2 x 2 host
        ("v6e-1", (1, 1, 1)),
        ("v6e-2", (1, 2, 1)),
        ("v5litepod-4", (2, 2, 1)),  # exactly one host
        ("v5litepod-8", (2, 2, 1)),
        ("v6e-256", (2, 2, 1)),
        ("v5p-8", (2, 2, 1)),
        ("v5p-1024", (2, 2, 1)),
        ("2 x v5e-1", (1, 1, 1)),
    ],
)
def test_a_host_holds_no_more_chips_than_the_slice(name: str, bounds: tuple[int, int, int]) -> None:
    tpu = parse_slice(name)
    assert tpu.chips_per_host_bounds() == bounds
    torus = (*torus_shape(tpu.chip, tpu.chips), 1, 1)[:3]
    assert all(host <= side and side % host == 0 for host, side in zip(bounds, torus, strict=True))


def test_host_bounds_of_a_torus() -> None:
    assert host_bounds((1, 1)) == (1, 1, 1)
    assert host_bounds((1, 2)) == (1, 2, 1)
    assert host_bounds((2, 4)) == (2, 2, 1)
    assert host_bounds((4, 8, 8)) == (2, 2, 1)
