"""The torch_xla executor: a sharding plan as torch_xla SPMD annotations, for XLA's partitioner.

One process drives every device (``torch_xla.runtime.use_spmd``); each parameter of a model on the
``xla`` device is annotated with the plan's layout (``mark_sharding``) over a named mesh, and each
batch with its data split, by the same rules the other executors use (``titanpod.parallel.mesh_dims``).
XLA then inserts the all-gathers and gradient reductions. Imports torch_xla only when called.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from titanpod.parallel.errors import PlanError
from titanpod.parallel.mesh_dims import batch_mesh_dims, param_mesh_dims
from titanpod.parallel.plan import ShardingPlan


def spmd_mesh(axes: Mapping[str, int]) -> Any:
    """A torch_xla SPMD mesh with ``axes`` (name -> size, outermost first) over every device of the job;
    ``PlanError`` when the sizes do not multiply to the device count."""
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    devices = xr.global_runtime_device_count()
    if math.prod(axes.values()) != devices:
        raise PlanError(
            f"The mesh {dict(axes)} spans {math.prod(axes.values())} devices, but torch_xla sees {devices}; "
            "set the parallel degrees to multiply to the device count (on the host: CPU_NUM_DEVICES)."
        )
    return xs.Mesh(np.arange(devices), tuple(axes.values()), tuple(axes))


def shard_parameters(model: nn.Module, plan: ShardingPlan, mesh: Any, axes: Mapping[str, int]) -> None:
    """Annotate every parameter of ``model`` (on the ``xla`` device) with the plan's layout on ``mesh``."""
    import torch_xla.distributed.spmd as xs

    plan.check(dict(model.named_parameters()), axes)
    for name, param in model.named_parameters():
        xs.mark_sharding(param, mesh, param_mesh_dims(plan, name, param.ndim, axes))


def shard_batch(tensor: torch.Tensor, mesh: Any, axes: Mapping[str, int]) -> torch.Tensor:
    """Annotate a batch tensor on the ``xla`` device: its first dimension split over the data axes."""
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(tensor, mesh, batch_mesh_dims(axes, tensor.ndim))
    return tensor
