"""The tpu lane: PyTorch's native TPU device through torch_tpu.

torch_tpu registers ``torch.device("tpu")`` as a PyTorch accelerator, so device work goes
through the generic ``torch.accelerator`` API. Compile with ``backend="tpu"`` explicitly:
torch_tpu patches ``torch.compile``'s default.
"""

from __future__ import annotations

import contextlib
import os

import torch

from titanpod.device.backend import Backend
from titanpod.device.chips import ChipSpec, chip_by_name
from titanpod.device.memory import MemoryStats, host_memory_stats

TPU_TYPE_ENV_VARS = ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE")
"""Environment variables a TPU VM sets to its slice type, e.g. ``v5p-128``."""


class TpuBackend(Backend):
    """PyTorch on TPU through torch_tpu."""

    lane = "tpu"
    device_type = "tpu"
    dist_backend = None
    compile_backend = "tpu"

    def __init__(self) -> None:
        import torch_tpu  # noqa: F401 - registers the tpu device when autoload is off

    def device_count(self) -> int:
        """TPU devices visible to this process."""
        return torch.accelerator.device_count()

    def synchronize(self) -> None:
        """Wait for queued TPU work."""
        torch.accelerator.synchronize()

    def memory_stats(self) -> MemoryStats:
        """Device memory from ``torch.accelerator.memory``; host memory if torch_tpu lacks it."""
        try:
            current = torch.accelerator.memory.memory_allocated()
            peak = torch.accelerator.memory.max_memory_allocated()
        except (RuntimeError, NotImplementedError, AttributeError):
            return host_memory_stats()
        return MemoryStats(current, peak, self.chip().memory_bytes, "device")

    def reset_peak_memory(self) -> None:
        """Reset the peak counter, where torch_tpu supports it."""
        with contextlib.suppress(RuntimeError, NotImplementedError, AttributeError):
            torch.accelerator.memory.reset_peak_memory_stats()

    def chip(self) -> ChipSpec:
        """The TPU generation, from the slice type the VM advertises."""
        for var in TPU_TYPE_ENV_VARS:
            if os.environ.get(var):
                return chip_by_name(os.environ[var])
        raise KeyError(
            "Cannot tell which TPU generation this is: none of "
            f"{', '.join(TPU_TYPE_ENV_VARS)} is set. Set TPU_ACCELERATOR_TYPE (e.g. v5p-128)."
        )
