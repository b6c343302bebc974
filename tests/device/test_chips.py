"""The chip table and the CPU and GPU peak probes."""

from types import SimpleNamespace

import pytest
import torch

from titanpod.device import CHIPS, chip_by_name, measure_cpu_peak
from titanpod.device import chips as chips_module
from titanpod.device.chips import GB, GiB, matmul_peak_flops, measure_gpu_peak


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
        ("a100", 312, 80 * GB),
        ("l4", 121, 24 * GB),
        ("l40s", 362.05, 48 * GB),
        ("rtx4090", 165.2, 24 * GB),
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


@pytest.mark.parametrize("name", ["v4", "h100", "h200", "b200", "a100", "l4", "l40s", "rtx4090"])
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
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-SXM4-40GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A100-PCIE-40GB", "a100"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("rtx4090", "rtx4090"),
    ],
)
def test_loose_names_find_the_chip(spelling, canonical):
    assert chip_by_name(spelling).name == canonical


@pytest.mark.parametrize(
    ("spelling", "memory"),
    [
        ("NVIDIA A100-SXM4-40GB", 40 * GB),
        ("NVIDIA A100-PCIE-40GB", 40 * GB),
        ("NVIDIA A100-SXM4-80GB", 80 * GB),
        ("a100", 80 * GB),
        ("a100-40gb", 40 * GB),
        ("NVIDIA H100 80GB HBM3", 80 * GB),
    ],
)
def test_a_gpu_product_name_that_states_its_memory_gets_it(spelling, memory):
    chip = chip_by_name(spelling)
    assert chip.memory_bytes == memory
    assert chip.peak_flops == CHIPS[chip.name].peak_flops


@pytest.mark.parametrize(
    "spelling",
    [
        "NVIDIA GeForce RTX 3060",
        "Tesla T4",
        "NVIDIA L40",  # not the L4, nor the L40S: half the L40S's tensor rate
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a slice of the GPU, not its peak
    ],
)
def test_other_gpus_are_not_taken_for_a_listed_one(spelling):
    with pytest.raises(KeyError, match="Unknown chip"):
        chip_by_name(spelling)


def test_unknown_chip_lists_the_known_ones():
    with pytest.raises(KeyError, match=r"known chips: v4, v5e, v5p.*Did you mean 'v5p'"):
        chip_by_name("v5q")


def test_cpu_probe_measures_a_positive_matmul_rate():
    chip = measure_cpu_peak(size=256, seconds=0.05)
    assert chip.measured and chip.name == "cpu" and chip.auto_lane == "cpu"
    assert 1e8 < chip.peak_flops < 1e14  # between a toaster and a rack of GPUs
    assert chip.memory_bytes > 0


def test_the_matmul_probe_times_each_call_between_synchronisations():
    syncs = []
    rate = matmul_peak_flops(torch.device("cpu"), torch.float32, lambda: syncs.append(1), size=128, seconds=0.0)
    assert len(syncs) == 2  # after the warm-up call, then after the one timed call a spent budget still gets
    assert 1e6 < rate < 1e14


def test_the_gpu_probe_measures_bf16_on_the_given_gpu_and_describes_it(monkeypatch):
    calls = []

    def fake_rate(device, dtype, synchronize, size, seconds):
        calls.append((device, dtype, synchronize, size, seconds))
        return 12.3e12

    properties = {1: SimpleNamespace(major=8, total_memory=12 * GiB)}
    monkeypatch.setattr(chips_module, "matmul_peak_flops", fake_rate)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties.__getitem__)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"NVIDIA GeForce RTX 3060 #{index}")
    monkeypatch.setattr(torch.cuda, "device", _NoDeviceSwitch)

    chip = measure_gpu_peak(1, size=64, seconds=0.01)

    assert calls == [(torch.device("cuda", 1), torch.bfloat16, torch.cuda.synchronize, 64, 0.01)]
    assert chip.name == "NVIDIA GeForce RTX 3060 #1"
    assert (chip.peak_flops, chip.memory_bytes, chip.measured, chip.auto_lane) == (12.3e12, 12 * GiB, True, "cuda")


def test_the_gpu_probe_uses_fp16_before_ampere(monkeypatch):
    dtypes = []
    monkeypatch.setattr(chips_module, "matmul_peak_flops", lambda _d, dtype, *_: dtypes.append(dtype) or 30e12)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    turing = SimpleNamespace(major=7, total_memory=15 * GiB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: turing)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "device", _NoDeviceSwitch)
    assert measure_gpu_peak().name == "Tesla T4"
    assert dtypes == [torch.float16]


class _NoDeviceSwitch:
    """Stands in for ``torch.cuda.device`` where there is no GPU to switch to."""

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


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
