"""Tensor parallelism: a region's input is shared by the tp ranks, its output summed over them.

Inside a region (attention, dense feed-forward) the column-parallel projections hold
some heads or hidden units and the row-parallel one gives partial sums, so the model's
own code runs unchanged on local shards.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from titanpod.parallel.errors import PlanError
from titanpod.parallel.torch_executor.collectives import enter_tensor_parallel, leave_tensor_parallel


def apply_tensor_parallel(model: nn.Module, regions: tuple[str, ...], tp_mesh: DeviceMesh) -> list[str]:
    """Wrap every module whose name matches one of ``regions`` with the tp collectives; return their names."""
    wrapped = []
    for name, module in model.named_modules():
        if not any(re.fullmatch(pattern, name) for pattern in regions):
            continue

        def enter(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            return (enter_tensor_parallel(args[0], tp_mesh), *args[1:])

        def leave(_module: nn.Module, _args: tuple[Any, ...], output: Any, name: str = name) -> Any:
            if isinstance(output, tuple):
                raise PlanError(
                    f"{name} returns several outputs (a mixture of experts); it cannot run tensor-parallel."
                )
            return leave_tensor_parallel(output, tp_mesh)

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)
        wrapped.append(name)
    return wrapped
