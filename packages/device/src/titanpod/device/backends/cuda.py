"""The cuda lane: PyTorch on NVIDIA GPUs, NCCL collectives, inductor compilation."""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from titanpod.device.backend import Backend
from titanpod.device.chips import TFLOPS, ChipSpec, chip_by_name, measure_gpu_peak
from titanpod.device.host_launch import HostLaunch
from titanpod.device.memory import MemoryStats
from titanpod.device.probes import cuda_visible


class CudaBackend(Backend):
    """PyTorch on CUDA GPUs."""

    lane = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    compile_backend = "inductor"
    launch = HostLaunch(counts_local_devices=True)

    def __init__(self) -> None:
        self._chip: ChipSpec | None = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why not: PyTorch sees no CUDA device (and which build of PyTorch this is)."""
        if cuda_visible():
            return None
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (
            f"lane 'cuda' needs a CUDA GPU, but PyTorch {torch.__version__} ({build}) sees none. "
            "Check nvidia-smi and CUDA_VISIBLE_DEVICES, or choose another lane (TITANPOD_LANE=cpu)."
        )

    def device_count(self) -> int:
        """GPUs visible to this process."""
        return torch.cuda.device_count()

    def synchronize(self, local_rank: int = 0) -> None:
        """Wait for the streams of this local rank's GPU."""
        torch.cuda.synchronize(local_rank)

    def memory_stats(self, local_rank: int = 0) -> MemoryStats:
        """Bytes held by PyTorch's caching allocator on this local rank's GPU."""
        return MemoryStats(
            current_bytes=torch.cuda.memory_allocated(local_rank),
            peak_bytes=torch.cuda.max_memory_allocated(local_rank),
            limit_bytes=torch.cuda.get_device_properties(local_rank).total_memory,
            kind="device",
        )

    def reset_peak_memory(self, local_rank: int = 0) -> None:
        """Reset the allocator's peak counter of this local rank's GPU."""
        torch.cuda.reset_peak_memory_stats(local_rank)

    def chip(self) -> ChipSpec:
        """The current GPU: the chip table's peak with the device's own memory (looked up once per backend).

        A GPU model the table does not list gets a peak measured by a short bf16 matmul probe
        (``measure_gpu_peak``, about half a second), and a one-line notice on stderr says so.
        """
        if self._chip is None:
            index = torch.cuda.current_device()
            name = torch.cuda.get_device_name(index)
            try:
                spec = chip_by_name(name)
            except KeyError:
                spec = measure_gpu_peak(index)
                print(
                    f"titanpod: GPU {name!r} is not in the chip table; measured a matmul peak of "
                    f"{spec.peak_flops / TFLOPS:.1f} TFLOP/s for MFU "
                    "(add it to titanpod.device.chips.CHIPS for a datasheet figure)",
                    file=sys.stderr,
                )
            self._chip = replace(spec, memory_bytes=torch.cuda.get_device_properties(index).total_memory)
        return self._chip
