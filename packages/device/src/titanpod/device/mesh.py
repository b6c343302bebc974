"""Device meshes with named axes: ``torch.distributed.DeviceMesh`` or ``jax.sharding.Mesh``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from titanpod.device.distributed import CollectiveLane, ensure_process_group
from titanpod.device.errors import MeshError


def check_mesh_axes(axes: Mapping[str, int], world_size: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Validate a mesh description against the number of devices and split it into names and sizes.

    Raises ``MeshError`` naming the problem: no axes, a size below 1, or sizes whose
    product is not the world size.
    """
    if not axes:
        raise MeshError("A mesh needs at least one axis, e.g. {'fsdp': world_size}.")
    names = tuple(axes)
    sizes = tuple(int(size) for size in axes.values())
    bad = [f"{name}={size}" for name, size in zip(names, sizes, strict=True) if size < 1]
    if bad:
        raise MeshError(f"Mesh axis sizes must be at least 1; got {', '.join(bad)}.")
    total = math.prod(sizes)
    if total != world_size:
        shape = " x ".join(f"{name}={size}" for name, size in zip(names, sizes, strict=True))
        raise MeshError(
            f"Mesh {shape} spans {total} devices but the job has {world_size}; "
            f"choose axis sizes whose product is {world_size}."
        )
    return names, sizes


def build_torch_mesh(backend: CollectiveLane, axes: Mapping[str, int]) -> Any:
    """A ``DeviceMesh`` over all ranks of the job (joining the process group if needed)."""
    from torch.distributed.device_mesh import init_device_mesh

    info = ensure_process_group(backend)
    names, sizes = check_mesh_axes(axes, info.world_size)
    return init_device_mesh(backend.device_type, sizes, mesh_dim_names=names)


def build_jax_mesh(axes: Mapping[str, int]) -> Any:
    """A ``jax.sharding.Mesh`` over every JAX device of the job, axes in the given order."""
    import jax
    import numpy as np

    devices = jax.devices()
    names, sizes = check_mesh_axes(axes, len(devices))
    return jax.sharding.Mesh(np.asarray(devices).reshape(sizes), names)
