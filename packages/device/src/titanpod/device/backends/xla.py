"""The xla lane: PyTorch code on JAX devices through torchax, compiled with ``jax.jit``.

Tensors on this lane have ``device.type == "jax"`` and must be made inside
``backend.runtime()`` (torchax's environment). Collectives come from XLA's SPMD
partitioner, given shardings over a ``jax.sharding.Mesh``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch

from titanpod.device.backend import Backend
from titanpod.device.chips import ChipSpec, chip_by_name
from titanpod.device.memory import MemoryStats, accelerator_memory_stats, host_memory_stats
from titanpod.device.peak_cache import cached_cpu_peak
from titanpod.device.probes import module_installed

TORCHAX_DEVICE_NAME = "jax"
"""The name torchax gives PyTorch's one PrivateUse1 device when it is imported."""


def privateuse1_taken() -> str | None:
    """Why torchax cannot start in this process: another backend has already named PyTorch's PrivateUse1 device.

    On a TPU VM with torch_tpu installed, torch's device-backend autoload runs torch_tpu's loader at
    ``import torch``, which names the device ``tpu``; torchax then fails to name it ``jax`` (torch allows one name
    per process, once)."""
    name = torch._C._get_privateuse1_backend_name()
    if name in ("privateuseone", TORCHAX_DEVICE_NAME):
        return None
    return (
        f"lane 'xla' cannot start in this process: PyTorch's PrivateUse1 device is already registered as "
        f"'{name}' (torch_tpu loads itself at `import torch` where TORCH_DEVICE_BACKEND_AUTOLOAD is not 0), and "
        f"torchax needs it as '{TORCHAX_DEVICE_NAME}'. Start the command with TORCH_DEVICE_BACKEND_AUTOLOAD=0 "
        "(the tpu lane then loads torch_tpu itself), or use that device's lane (--device.lane tpu)."
    )


class XlaBackend(Backend):
    """torchax over JAX: runs wherever JAX does (CPU, GPU, TPU)."""

    lane = "xla"
    device_type = "jax"
    dist_backend = None
    compile_backend = None
    single_controller = True
    supports_pipeline = False
    traces_with_jax = True
    stand_in_lanes = ("xla",)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why not: jax or torchax is not installed, or another backend holds PyTorch's PrivateUse1 device."""
        missing = [m for m in ("jax", "torchax") if not module_installed(m)]
        if not missing:
            return privateuse1_taken()
        return (
            f"lane 'xla' needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            "not installed. Install them with: pip install 'titanpod-device[xla]' "
            "(in this repository: uv sync)."
        )

    def __init__(self) -> None:
        import jax
        import torchax

        self._jax: Any = jax
        self._env: Any = torchax.default_env()
        self._chip: ChipSpec | None = None

    def device(self, local_rank: int = 0) -> torch.device:
        """torchax's device; the arrays behind it live on JAX's devices."""
        return torch.device("jax", 0)

    def parameter_device(self, local_rank: int = 0) -> torch.device:
        """The host: the jitted step places each parameter on the JAX devices by the plan itself."""
        return torch.device("cpu")

    def device_count(self) -> int:
        """JAX devices of this process."""
        return self._jax.local_device_count()

    def runtime(self) -> contextlib.AbstractContextManager[Any]:
        """torchax's environment: inside it, torch ops on ``jax`` tensors run as JAX ops."""
        return self._env

    def synchronize(self, local_rank: int = 0) -> None:
        """Wait for every computation JAX has dispatched (one process drives every device)."""
        self._jax.effects_barrier()
        for array in self._jax.live_arrays():
            array.block_until_ready()

    def memory_stats(self, local_rank: int = 0) -> MemoryStats:
        """Memory of this process's first JAX device (``accelerator_memory_stats``: a TPU program's reserved
        temporaries count); the host's resident set where JAX keeps no statistics (CPU)."""
        stats = self._jax.local_devices()[0].memory_stats()
        if not stats:
            return host_memory_stats()
        return accelerator_memory_stats(stats)

    def chip(self) -> ChipSpec:
        """The chip from JAX's device kind; measured when JAX runs on the CPU."""
        if self._chip is None:
            device = self._jax.local_devices()[0]
            self._chip = cached_cpu_peak() if device.platform == "cpu" else chip_by_name(device.device_kind)
        return self._chip

    def build_mesh(self, axes: Mapping[str, int]) -> Any:
        """A ``jax.sharding.Mesh`` over every JAX device of the job."""
        from titanpod.device.mesh import build_jax_mesh

        return build_jax_mesh(axes)
