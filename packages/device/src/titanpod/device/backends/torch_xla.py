"""The torch_xla lane (legacy): lazy tensors on PJRT devices."""

from __future__ import annotations

from typing import Any

import torch

from titanpod.device.backend import Backend
from titanpod.device.chips import ChipSpec, chip_by_name
from titanpod.device.memory import MemoryStats


class TorchXlaBackend(Backend):
    """PyTorch/XLA lazy tensors; kept for installs that already use torch_xla."""

    lane = "torch_xla"
    device_type = "xla"
    dist_backend = "xla"
    compile_backend = "openxla"

    def __init__(self) -> None:
        import torch_xla.core.xla_model as xm

        self._xm: Any = xm

    def device(self, local_rank: int = 0) -> torch.device:
        """The XLA device of this process (PJRT assigns one per process)."""
        return self._xm.xla_device()

    def device_count(self) -> int:
        """XLA devices visible to this process."""
        import torch_xla.runtime as xr

        return xr.addressable_runtime_device_count()

    def synchronize(self) -> None:
        """Cut the lazy graph and wait for the device."""
        self._xm.mark_step()
        self._xm.wait_device_ops()

    def memory_stats(self) -> MemoryStats:
        """Device memory in use and its limit, as PJRT reports them."""
        info = self._xm.get_memory_info(self.device())
        used = int(info.get("bytes_used", 0))
        return MemoryStats(used, int(info.get("peak_bytes_used", used)), info.get("bytes_limit"), "device")

    def chip(self) -> ChipSpec:
        """The chip, from the device kind PJRT reports."""
        import torch_xla.runtime as xr

        return chip_by_name(xr.device_type() if hasattr(xr, "device_type") else "unknown")
