"""titanpod.device: the backend shim.

Pick a lane (``resolve_lane``), get its ``Backend`` (``get_backend``) and ask it for
devices, meshes, synchronisation, memory statistics and the chip's peak. A lane's backend
class comes from the ``LaneRegistry`` (``backend_class``); its class attributes say what
the lane can do, without starting it. Importing this package imports nothing heavy: each name
loads its module on first use (``DeviceConfig`` needs no torch); jax, torch_tpu and torch_xla load
when a lane needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from titanpod.device.cpu_features import cpu_features  # named as its module: bound here, never shadowed by it

if TYPE_CHECKING:
    from titanpod.device.backend import Backend
    from titanpod.device.chips import CHIPS, ChipSpec, chip_by_name, measure_cpu_peak
    from titanpod.device.config import DeviceConfig
    from titanpod.device.distributed import ProcessInfo, ensure_process_group, process_info
    from titanpod.device.errors import LaneUnavailableError, MeshError
    from titanpod.device.factory import get_backend
    from titanpod.device.host_launch import HostLaunch
    from titanpod.device.lanes import LANE_ENV_VAR, LANES, resolve_lane
    from titanpod.device.memory import MemoryStats
    from titanpod.device.mesh import check_mesh_axes
    from titanpod.device.peak_cache import cached_cpu_peak
    from titanpod.device.registry import LANE_REGISTRY, LaneRegistry, backend_class

_HOMES = {
    "Backend": "titanpod.device.backend",
    "CHIPS": "titanpod.device.chips",
    "ChipSpec": "titanpod.device.chips",
    "chip_by_name": "titanpod.device.chips",
    "measure_cpu_peak": "titanpod.device.chips",
    "DeviceConfig": "titanpod.device.config",
    "ProcessInfo": "titanpod.device.distributed",
    "ensure_process_group": "titanpod.device.distributed",
    "process_info": "titanpod.device.distributed",
    "LaneUnavailableError": "titanpod.device.errors",
    "MeshError": "titanpod.device.errors",
    "get_backend": "titanpod.device.factory",
    "HostLaunch": "titanpod.device.host_launch",
    "LANE_ENV_VAR": "titanpod.device.lanes",
    "LANES": "titanpod.device.lanes",
    "resolve_lane": "titanpod.device.lanes",
    "MemoryStats": "titanpod.device.memory",
    "check_mesh_axes": "titanpod.device.mesh",
    "cached_cpu_peak": "titanpod.device.peak_cache",
    "LANE_REGISTRY": "titanpod.device.registry",
    "LaneRegistry": "titanpod.device.registry",
    "backend_class": "titanpod.device.registry",
}
"""Where each public name lives: imported on first use, so a module of this package that needs none of them
(a config dataclass the command line reads) is imported without the rest."""

__all__ = [
    "CHIPS",
    "LANES",
    "LANE_ENV_VAR",
    "LANE_REGISTRY",
    "Backend",
    "ChipSpec",
    "DeviceConfig",
    "HostLaunch",
    "LaneRegistry",
    "LaneUnavailableError",
    "MemoryStats",
    "MeshError",
    "ProcessInfo",
    "backend_class",
    "cached_cpu_peak",
    "check_mesh_axes",
    "chip_by_name",
    "cpu_features",
    "ensure_process_group",
    "get_backend",
    "measure_cpu_peak",
    "process_info",
    "resolve_lane",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'titanpod.device' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
