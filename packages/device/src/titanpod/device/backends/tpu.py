"""The tpu lane: PyTorch's native TPU device through torch_tpu.

torch_tpu registers ``torch.device("tpu")`` as a PyTorch accelerator, so device work goes
through the generic ``torch.accelerator`` API. Compile with ``backend="tpu"`` explicitly:
torch_tpu patches ``torch.compile``'s default.

torch's device-backend autoload (``TORCH_DEVICE_BACKEND_AUTOLOAD``, on unless set to 0) calls
torch_tpu's loader at ``import torch``; with autoload off nothing does, so the backend calls the
same loader itself (``register_tpu_device``). Either way the loader registers the device only
where its PCI scan finds TPU chips.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch
from packaging.version import Version

from titanpod.device.backend import Backend
from titanpod.device.chips import ChipSpec, chip_by_name
from titanpod.device.errors import LaneUnavailableError
from titanpod.device.host_launch import HostLaunch
from titanpod.device.memory import MemoryStats, unavailable_memory_stats
from titanpod.device.probes import installed_version, module_installed, tpu_attached

TPU_TYPE_ENV_VARS = ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE")
SDPA_KERNEL_LIBTPU = Version("0.0.50")
"""The oldest libtpu whose Mosaic compiles torch_tpu's SDPA kernel (it uses ``math.log2``, which 0.0.42.1 cannot
lower: docs/tpu-chip.md); torch_tpu 0.2.0 asks for this libtpu or later."""
"""Environment variables a TPU VM sets to its slice type, e.g. ``v5p-128``."""


def tpu_device_registered() -> bool:
    """Whether ``torch.device("tpu")`` names a registered device in this process."""
    return torch._C._get_privateuse1_backend_name() == "tpu"


def register_tpu_device() -> None:
    """Make ``torch.device("tpu")`` usable, with torch's autoload on or off.

    Runs torch_tpu's loader (the entry point torch's autoload would call; a no-op once loaded).
    Raises ``LaneUnavailableError`` naming the cause where torch_tpu is missing or finds no chips.
    """
    if tpu_device_registered():
        return
    try:
        from torch_tpu import _loader
    except ImportError as error:
        raise LaneUnavailableError(
            f"The tpu lane needs torch_tpu ({error}). On a TPU VM install the tpu environment: "
            "uv sync --locked --project envs/tpu (see the README's TPU section)."
        ) from error
    _loader.load()
    if not tpu_device_registered():
        raise LaneUnavailableError(
            "torch_tpu is installed but registered no tpu device: it found no TPU chips on this machine. "
            "Run on a TPU VM, or pick another lane (--device.lane cpu, cuda or xla)."
        )


class TpuBackend(Backend):
    """PyTorch on TPU through torch_tpu."""

    lane = "tpu"
    device_type = "tpu"
    dist_backend = None
    compile_backend = "tpu"
    compiled_step_donates_inputs = False  # its torch.compile path passes no inputs to donate (torch_tpu 0.2.0)
    update_as_one_program = True  # through torch_tpu's jax_op, which donates
    stand_in_lanes = ("cpu", "xla")  # a pod's step is built by the torch executor or as XLA SPMD
    launch = HostLaunch(
        devices_per_host_var="TORCH_TPU_DEVICES_PER_HOST",
        devices_from_slice_type=True,
        workers_from_vm_metadata=True,
        slicebuilder_ports=True,
    )

    def __init__(self) -> None:
        register_tpu_device()

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why not: torch_tpu is not installed, or no TPU is attached."""
        if not module_installed("torch_tpu"):
            return (
                "lane 'tpu' needs torch_tpu, which is not installed. On a TPU VM install the tpu "
                "environment: uv sync --locked --project envs/tpu (or pip install 'titanpod-device[tpu]'). "
                "Do not install it where there is no TPU: without libtpu, `import torch` fails."
            )
        if not tpu_attached():
            return (
                "lane 'tpu' needs a TPU, but none is attached to this machine "
                "(no /dev/accel* node and no Google PCI device). Run on a TPU VM, or choose "
                "another lane (TITANPOD_LANE=cpu)."
            )
        return None

    @classmethod
    def sdpa_problem(cls) -> str | None:
        """torch_tpu runs ``scaled_dot_product_attention`` as a Pallas kernel that libtpu before 0.0.50 cannot
        compile; the run would fail at its first backward, on the chip, with a Mosaic error."""
        installed = installed_version("libtpu")
        if installed is None or Version(installed) >= SDPA_KERNEL_LIBTPU:
            return None
        return (
            f"on the tpu lane it runs torch_tpu's SDPA kernel, which libtpu {installed} cannot compile (it needs "
            f"libtpu {SDPA_KERNEL_LIBTPU} or later; uv sync --locked --project envs/tpu installs 0.0.52)"
        )

    @classmethod
    def profiler_config(cls, folder: Path, rank: int) -> Any:
        """torch_tpu's public profiler option: it adds the TPU's XProf trace beside the CPU's."""
        return torch.tpu.profiler.TpuProfilerConfig(run_dir=str(folder), worker_rank=f"rank{rank}")  # type: ignore[attr-defined]

    def device_count(self) -> int:
        """TPU devices visible to this process."""
        return torch.accelerator.device_count()

    def synchronize(self, local_rank: int = 0) -> None:
        """Wait for the work queued on this local rank's TPU."""
        torch.accelerator.synchronize(local_rank)

    def memory_stats(self, local_rank: int = 0) -> MemoryStats:
        """Memory of this local rank's TPU from ``torch.accelerator.memory``; ``unavailable`` (with the reason)
        where torch_tpu does not report it. Host memory is never passed off as the TPU's."""
        limit = _chip_memory_or_none()
        try:
            current = torch.accelerator.memory.memory_allocated(local_rank)
            peak = torch.accelerator.memory.max_memory_allocated(local_rank)
        except (RuntimeError, NotImplementedError, AttributeError) as error:
            return unavailable_memory_stats(f"torch_tpu does not report device memory: {error}", limit)
        if limit is not None and max(current, peak) > limit:
            # Seen with torch_tpu 0.2.0 on libtpu 0.0.42.1: a peak of 129,818 GiB on a 16 GiB chip.
            return unavailable_memory_stats(
                f"torch_tpu reported {max(current, peak) / 1024**3:,.2f} GiB in use on a chip of "
                f"{limit / 1024**3:,.2f} GiB, which cannot be right",
                limit,
            )
        return MemoryStats(current, peak, limit, "device")

    def reset_peak_memory(self, local_rank: int = 0) -> None:
        """Reset the peak counter of this local rank's TPU, where torch_tpu supports it."""
        with contextlib.suppress(RuntimeError, NotImplementedError, AttributeError):
            torch.accelerator.memory.reset_peak_memory_stats(local_rank)

    def chip(self) -> ChipSpec:
        """The TPU generation, from the slice type the VM advertises."""
        return tpu_chip_from_environment()


def tpu_chip_from_environment() -> ChipSpec:
    """The TPU generation named by the slice type the VM advertises (``TPU_ACCELERATOR_TYPE``)."""
    for var in TPU_TYPE_ENV_VARS:
        if os.environ.get(var):
            return chip_by_name(os.environ[var])
    raise KeyError(
        "Cannot tell which TPU generation this is: none of "
        f"{', '.join(TPU_TYPE_ENV_VARS)} is set. Set TPU_ACCELERATOR_TYPE (e.g. v5p-128)."
    )


def _chip_memory_or_none() -> int | None:
    try:
        return tpu_chip_from_environment().memory_bytes
    except KeyError:
        return None
