"""The chip table and the CPU peak probe."""

import pytest

from titanpod.device import CHIPS, chip_by_name, measure_cpu_peak
from titanpod.device.chips import GB, GiB


@pytest.mark.parametrize(
    ("name", "tflops", "memory"),
    [
        ("v4", 275, 32 * GiB),
        ("v5e", 197, 16 * GiB),
        ("v5p", 459, 95 * GiB),
        ("v6e", 918, 32 * GiB),
        ("h100", 989, 80 * GB),
        ("h200", 989, 141 * GB),
        ("b200", 2250, 180 * GB),
    ],
)
def test_published_peaks_per_device(name, tflops, memory):
    chip = CHIPS[name]
    assert chip.peak_flops == tflops * 1e12
    assert chip.memory_bytes == memory
    assert chip.devices_per_chip == 1


def test_v7_splits_the_chip_into_two_devices():
    v7 = CHIPS["v7"]
    assert v7.devices_per_chip == 2
    assert v7.peak_flops * 2 == pytest.approx(2307e12)
    assert v7.memory_bytes * 2 == 192 * GB


@pytest.mark.parametrize(
    ("name", "chips", "memory"),
    [("v5e", 4, 192 * GB), ("v5p", 4, 448 * GB), ("v6e", 4, 720 * GB), ("v7", 4, 960 * GB)],
)
def test_published_worker_vm_figures(name, chips, memory):
    chip = CHIPS[name]
    assert (chip.chips_per_host, chip.host_vm_bytes, chip.auto_lane) == (chips, memory, "tpu")


@pytest.mark.parametrize("name", ["v4", "h100", "h200", "b200"])
def test_worker_vm_figures_without_a_published_source_are_unknown(name):
    chip = CHIPS[name]
    assert chip.chips_per_host is None and chip.host_vm_bytes is None
    assert chip.auto_lane == ("tpu" if name == "v4" else "cuda")


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("v5p-128", "v5p"),
        ("TPU v5p", "v5p"),
        ("TPU v5 lite", "v5e"),
        ("v5litepod-16", "v5e"),
        ("TPU v6 lite", "v6e"),
        ("trillium", "v6e"),
        ("TPU7x", "v7"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA B200", "b200"),
    ],
)
def test_loose_names_find_the_chip(spelling, canonical):
    assert chip_by_name(spelling).name == canonical


def test_unknown_chip_lists_the_known_ones():
    with pytest.raises(KeyError, match=r"known chips: v4, v5e, v5p.*Did you mean 'v5p'"):
        chip_by_name("v5q")


def test_cpu_probe_measures_a_positive_matmul_rate():
    chip = measure_cpu_peak(size=256, seconds=0.05)
    assert chip.measured and chip.name == "cpu" and chip.auto_lane == "cpu"
    assert 1e8 < chip.peak_flops < 1e14  # between a toaster and a rack of GPUs
    assert chip.memory_bytes > 0


def test_cpu_peak_memory_window_can_be_reset():
    import torch

    from titanpod.device import get_backend

    backend = get_backend("cpu")
    block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    del block
    high = backend.memory_stats().peak_bytes
    backend.reset_peak_memory()
    after = backend.memory_stats()
    assert after.peak_bytes <= high - 32 * 1024 * 1024  # the 64 MiB spike is forgotten
    assert after.peak_bytes >= after.current_bytes
