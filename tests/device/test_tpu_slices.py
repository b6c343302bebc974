"""TPU slice names: accelerator types to chips and the torus libtpu is asked for."""

from __future__ import annotations

import pytest

from titanpod.device.tpu_slices import TpuSlice, parse_slice, slice_of, torus_shape


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
