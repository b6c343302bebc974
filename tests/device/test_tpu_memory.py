"""The tpu lane's memory statistics where torch_tpu cannot report them: absent, with the reason.

torch_tpu is not in this environment, so the backend is made without its constructor (which
registers the device) and torch.accelerator.memory is made to fail as a torch_tpu without memory
statistics does; envs/tpu checks the real torch_tpu's figures.
"""

from __future__ import annotations

import torch

from titanpod.device.backends.tpu import TpuBackend


def test_memory_statistics_say_unavailable_rather_than_report_host_memory(monkeypatch):
    def not_supported(device_index: int | None = None) -> int:
        raise RuntimeError("memory_allocated is not supported on this backend")

    monkeypatch.setattr(torch.accelerator.memory, "memory_allocated", not_supported)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v6e-16")
    backend = TpuBackend.__new__(TpuBackend)
    stats = backend.memory_stats()
    assert stats.kind == "unavailable"
    assert stats.current_bytes is None and stats.peak_bytes is None and stats.peak_gib is None
    assert "memory_allocated is not supported" in stats.reason
    assert stats.limit_bytes == 32 * 1024**3  # a v6e chip's HBM
    assert stats.as_gib() == {"current_gib": None, "peak_gib": None, "limit_gib": 32.0}


def test_a_figure_larger_than_the_chip_is_reported_unavailable_not_passed_on(monkeypatch):
    monkeypatch.setattr(torch.accelerator.memory, "memory_allocated", lambda device_index=None: 2 * 1024**3)
    monkeypatch.setattr(torch.accelerator.memory, "max_memory_allocated", lambda device_index=None: 129_818 * 1024**3)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    stats = TpuBackend.__new__(TpuBackend).memory_stats()
    assert stats.kind == "unavailable" and stats.peak_bytes is None
    assert "129,818.00 GiB" in stats.reason and "cannot be right" in stats.reason


def test_a_figure_within_the_chip_is_the_devices_own(monkeypatch):
    monkeypatch.setattr(torch.accelerator.memory, "memory_allocated", lambda device_index=None: 2 * 1024**3)
    monkeypatch.setattr(torch.accelerator.memory, "max_memory_allocated", lambda device_index=None: 3 * 1024**3)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    stats = TpuBackend.__new__(TpuBackend).memory_stats()
    assert stats.kind == "device" and stats.peak_gib == 3.0
