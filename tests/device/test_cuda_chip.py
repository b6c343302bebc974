"""The cuda lane's chip: the table's figures for a listed GPU, a measured peak (with a notice) for another.

There is no GPU here: ``torch.cuda``'s device queries and the probe are replaced.
"""

from types import SimpleNamespace

import pytest
import torch

from titanpod.device.backends import cuda as cuda_module
from titanpod.device.backends.cuda import CudaBackend
from titanpod.device.chips import CHIPS, GB, ChipSpec, GiB


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pose as GPU 2 of a machine, named as the test says; returns the probe's calls."""
    probes = []
    gpu = SimpleNamespace(name="", total_memory=0)

    def probe(index):
        probes.append(index)
        return ChipSpec(gpu.name, 12.3e12, gpu.total_memory, measured=True, auto_lane="cuda")

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: gpu.name if index == 2 else "wrong GPU")
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=gpu.total_memory, major=8)
    )
    monkeypatch.setattr(cuda_module, "measure_gpu_peak", probe)
    gpu.probes = probes
    return gpu


@pytest.mark.parametrize(
    ("device_name", "canonical"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-SXM4-40GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA H100 80GB HBM3", "h100"),
    ],
)
def test_a_listed_gpu_gets_the_datasheet_peak_and_its_own_memory_without_probing(
    fake_gpu, capsys, device_name, canonical
):
    fake_gpu.name = device_name
    fake_gpu.total_memory = 79 * GiB  # what the device reports, not the datasheet's round figure
    chip = CudaBackend().chip()
    assert chip.name == canonical
    assert chip.peak_flops == CHIPS[canonical].peak_flops and not chip.measured
    assert chip.memory_bytes == 79 * GiB
    assert fake_gpu.probes == []
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("device_name", ["NVIDIA GeForce RTX 3060", "Tesla T4"])
def test_an_unlisted_gpu_is_measured_once_with_a_notice(fake_gpu, capsys, device_name):
    fake_gpu.name = device_name
    fake_gpu.total_memory = 12 * GB
    backend = CudaBackend()
    chip = backend.chip()
    assert backend.chip() is chip  # cached on the backend: one probe however often MFU asks
    assert fake_gpu.probes == [2]  # the current GPU
    assert (chip.name, chip.peak_flops, chip.memory_bytes) == (device_name, 12.3e12, 12 * GB)
    assert chip.measured and chip.auto_lane == "cuda"
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"titanpod: GPU '{device_name}' is not in the chip table; measured a matmul peak of 12.3 TFLOP/s" in err
    assert "titanpod.device.chips.CHIPS" in err


def test_each_backend_looks_its_gpu_up_once(fake_gpu, monkeypatch):
    fake_gpu.name = "NVIDIA L4"
    fake_gpu.total_memory = 22 * GiB
    names = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: names.append(index) or "NVIDIA L4")
    backend = CudaBackend()
    assert backend.chip() is backend.chip()
    assert names == [2]
