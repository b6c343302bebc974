"""The cuda lane: PyTorch on NVIDIA GPUs, NCCL collectives, inductor compilation."""

from __future__ import annotations

import torch

from titanpod.device.backend import Backend
from titanpod.device.chips import ChipSpec, chip_by_name
from titanpod.device.memory import MemoryStats


class CudaBackend(Backend):
    """PyTorch on CUDA GPUs."""

    lane = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    compile_backend = "inductor"

    def device_count(self) -> int:
        """GPUs visible to this process."""
        return torch.cuda.device_count()

    def synchronize(self) -> None:
        """Wait for the current GPU's streams."""
        torch.cuda.synchronize()

    def memory_stats(self) -> MemoryStats:
        """Bytes held by PyTorch's caching allocator on the current GPU."""
        index = torch.cuda.current_device()
        return MemoryStats(
            current_bytes=torch.cuda.memory_allocated(index),
            peak_bytes=torch.cuda.max_memory_allocated(index),
            limit_bytes=torch.cuda.get_device_properties(index).total_memory,
            kind="device",
        )

    def reset_peak_memory(self) -> None:
        """Reset the allocator's peak counter."""
        torch.cuda.reset_peak_memory_stats()

    def chip(self) -> ChipSpec:
        """The datasheet figures of this GPU model; raises ``KeyError`` for an unlisted one."""
        return chip_by_name(torch.cuda.get_device_name())
