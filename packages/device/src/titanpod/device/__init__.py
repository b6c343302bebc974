"""titanpod.device: the backend shim.

Pick a lane (``resolve_lane``), get its ``Backend`` (``get_backend``) and ask it for
devices, meshes, synchronisation, memory statistics and the chip's peak. A lane's backend
class comes from the ``LaneRegistry`` (``backend_class``); its class attributes say what
the lane can do, without starting it. Importing this package imports torch only: jax,
torch_tpu and torch_xla load when a lane needs them.
"""

from titanpod.device.backend import Backend
from titanpod.device.chips import CHIPS, ChipSpec, chip_by_name, measure_cpu_peak
from titanpod.device.config import DeviceConfig
from titanpod.device.cpu_features import cpu_features
from titanpod.device.distributed import ProcessInfo, ensure_process_group, process_info
from titanpod.device.errors import LaneUnavailableError, MeshError
from titanpod.device.factory import get_backend
from titanpod.device.host_launch import HostLaunch
from titanpod.device.lanes import LANE_ENV_VAR, LANES, resolve_lane
from titanpod.device.memory import MemoryStats
from titanpod.device.mesh import check_mesh_axes
from titanpod.device.peak_cache import cached_cpu_peak
from titanpod.device.registry import LANE_REGISTRY, LaneRegistry, backend_class

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
