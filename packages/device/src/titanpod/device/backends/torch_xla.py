"""The torch_xla lane: PyTorch/XLA lazy tensors on PJRT devices (TPU, or the host with ``PJRT_DEVICE=CPU``).

Ops on ``xla`` tensors are recorded, not run; ``end_step`` cuts the recorded graph once per training
step (``torch_xla.sync()``), so every step runs as one compiled XLA program, cached by its shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from titanpod.device.backend import Backend
from titanpod.device.chips import ChipSpec, chip_by_name
from titanpod.device.memory import MemoryStats, host_memory_stats, unavailable_memory_stats
from titanpod.device.peak_cache import cached_cpu_peak
from titanpod.device.probes import module_installed, tpu_attached


class TorchXlaBackend(Backend):
    """PyTorch/XLA lazy tensors, for installs that already use torch_xla (its own environment: envs/torch_xla)."""

    lane = "torch_xla"
    device_type = "xla"
    dist_backend = "xla"
    compile_backend = "openxla"
    supports_pipeline = False
    spmd_on_request = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why not: torch_xla is not installed."""
        if module_installed("torch_xla"):
            return None
        return (
            "lane 'torch_xla' needs torch_xla, which is not installed. It is the legacy TPU "
            "path: pip install torch_xla built for your PyTorch version, or prefer lane 'tpu'."
        )

    @classmethod
    def detected(cls) -> bool:
        """torch_xla is installed and a TPU is attached (on the host CPU it runs only when asked for)."""
        return tpu_attached() and module_installed("torch_xla")

    def __init__(self) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        self._torch_xla: Any = torch_xla
        self._xm: Any = xm
        self._xr: Any = xr
        self._chip: ChipSpec | None = None
        self._batch_layout: Callable[[torch.Tensor], torch.Tensor] | None = None

    def use_spmd(self, batch_layout: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Drive every device from this one process (torch_xla SPMD), annotating each batch with ``batch_layout``
        (``titanpod.parallel.torch_xla_executor.shard_batch`` on the run's mesh). Call before any xla tensor exists."""
        self._xr.use_spmd()
        self._batch_layout = batch_layout

    @property
    def spmd(self) -> bool:
        """One process drives every device and XLA partitions the step (``use_spmd`` was called)."""
        return self._batch_layout is not None

    @property
    def on_host(self) -> bool:
        """PJRT runs on the host CPU (``PJRT_DEVICE=CPU``): memory and peak are the host's."""
        return self._xr.device_type() == "CPU"

    def device(self, local_rank: int = 0) -> torch.device:
        """The XLA device of this process (PJRT assigns one per process)."""
        return self._torch_xla.device()

    def device_count(self) -> int:
        """XLA devices visible to this process."""
        return self._xr.addressable_runtime_device_count()

    def devices_in_job(self, world_size: int) -> int:
        """Every device of the job under SPMD (one process drives them all), else one per process."""
        return self._xr.global_runtime_device_count() if self.spmd else world_size

    def place_batch(self, tensor: torch.Tensor, local_rank: int = 0) -> torch.Tensor:
        """The batch tensor on this process's ``xla`` device, split over the mesh's data axes under SPMD."""
        placed = tensor.to(self.device(local_rank))
        return placed if self._batch_layout is None else self._batch_layout(placed)

    def compile_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """The captured step traced by ``torch_xla.compile`` into one XLA program (cached by shape).

        Not ``torch.compile(backend="openxla")``: on the captured step (torch_xla 2.9) it returns the step's
        outputs but trains wrongly (the losses stop falling), where the same graph run as lazy tensors
        matches the cpu lane.
        """
        return self._torch_xla.compile(step, full_graph=True, name="titanpod_whole_step")

    def end_step(self) -> None:
        """Cut the recorded graph: the step's ops run now as one program, and the next step records anew."""
        self._torch_xla.sync()

    def synchronize(self, local_rank: int = 0) -> None:
        """Cut the lazy graph and wait for this process's device."""
        self._torch_xla.sync()
        self._xm.wait_device_ops()

    def memory_stats(self, local_rank: int = 0) -> MemoryStats:
        """Memory of this process's device as PJRT reports it; on the host PJRT device, the process's resident
        memory."""
        if self.on_host:
            return host_memory_stats()
        try:
            info = self._xm.get_memory_info(self.device(local_rank))
        except RuntimeError as error:  # a PJRT client without allocator statistics
            return unavailable_memory_stats(f"PJRT reports no memory statistics here ({error})")
        used = int(info.get("bytes_used", 0))
        return MemoryStats(used, int(info.get("peak_bytes_used", used)), info.get("bytes_limit"), "device")

    def chip(self) -> ChipSpec:
        """The chip: the host's measured peak under ``PJRT_DEVICE=CPU``, else the TPU generation PJRT names."""
        if self._chip is None:
            if self.on_host:
                self._chip = cached_cpu_peak()
            else:
                kind = self._xm.xla_device_hw(self.device())  # "TPU"; the generation is in the device kind
                attributes = self._xr.runtime_device_attributes(str(self.device()))
                self._chip = chip_by_name(str(attributes.get("device_kind", kind)))
        return self._chip
