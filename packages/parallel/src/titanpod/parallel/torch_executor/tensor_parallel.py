"""Tensor parallelism: a region's input is shared by the tp ranks, its output summed over them.

Inside a region (attention, dense feed-forward) the column-parallel projections hold
some heads or hidden units and the row-parallel one gives partial sums, so the model's
own code runs unchanged on local shards. Where a region spans modules (FLUX's joint attention
reads the q, k, v of two streams), the plan names where it is entered (the column-parallel
projections' module) and left (each row-parallel linear, whose bias is added once, after the sum).

With sequence parallelism, activations between regions (the residual stream and its
norms) are split along the sequence over the tp ranks: a region is entered by an
all-gather and left by a reduce-scatter instead of an all-reduce, so norms and residual
adds do 1/tp of the work and memory.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from titanpod.parallel.errors import PlanError
from titanpod.parallel.plan import ShardingPlan
from titanpod.parallel.torch_executor.collectives import (
    enter_tensor_parallel,
    gather_sequence,
    gather_sequence_for_all,
    keep_sequence_chunk,
    leave_tensor_parallel,
    scatter_sum_sequence,
)


def _matching(model: nn.Module, patterns: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    return [(name, module) for name, module in model.named_modules() if any(re.fullmatch(p, name) for p in patterns)]


def apply_tensor_parallel(model: nn.Module, plan: ShardingPlan, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Hook the plan's tp regions, entries and exits (and, with sequence parallelism, its sequence boundaries)
    into ``model``."""
    if sequence_parallel:
        enter_op, leave_op = gather_sequence, scatter_sum_sequence
    else:
        enter_op, leave_op = enter_tensor_parallel, leave_tensor_parallel
    for name, module in _matching(model, plan.tp_regions):

        def enter(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            return (enter_op(args[0], tp_mesh), *args[1:])

        def leave(_module: nn.Module, _args: tuple[Any, ...], output: Any, name: str = name) -> Any:
            if isinstance(output, tuple):
                raise PlanError(
                    f"{name} returns several outputs (a mixture of experts); it cannot run tensor-parallel."
                )
            return leave_op(output, tp_mesh)

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)
    _apply_enters_and_leaves(model, plan, tp_mesh, sequence_parallel)
    if not sequence_parallel:
        return

    def start(_module: nn.Module, _args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        if output.shape[1] % tp_mesh.size():
            raise PlanError(
                f"Sequence parallelism splits the sequence over tp={tp_mesh.size()} ranks, but the sequence has "
                f"{output.shape[1]} tokens; use a multiple of {tp_mesh.size()} or sequence_parallel=False."
            )
        return keep_sequence_chunk(output, tp_mesh)

    def end(_module: nn.Module, _args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        return gather_sequence_for_all(output, tp_mesh)

    for _, module in _matching(model, plan.sequence_starts):
        module.register_forward_hook(start)
    for _, module in _matching(model, plan.sequence_ends):
        module.register_forward_hook(end)


def _apply_enters_and_leaves(
    model: nn.Module, plan: ShardingPlan, tp_mesh: DeviceMesh, sequence_parallel: bool
) -> None:
    """Hook the plan's column-parallel entries and row-parallel exits (regions that span several modules)."""
    if (plan.tp_enters or plan.tp_leaves) and sequence_parallel:
        raise PlanError(
            "A plan with tp_enters / tp_leaves runs tensor-parallel without sequence parallelism: give it no "
            "sequence_starts, or set parallel.sequence_parallel to false."
        )

    def enter(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (enter_tensor_parallel(args[0], tp_mesh), *args[1:])

    for _, module in _matching(model, plan.tp_enters):
        module.register_forward_pre_hook(enter)
    for name, module in _matching(model, plan.tp_leaves):
        if not isinstance(module, nn.Linear):
            raise PlanError(f"{name} ends a tensor-parallel region as a row-parallel nn.Linear, but is {type(module)}.")

        def row_parallel(x: torch.Tensor, module: nn.Linear = module) -> torch.Tensor:
            summed = leave_tensor_parallel(F.linear(x, module.weight), tp_mesh)
            return summed if module.bias is None else summed + module.bias

        module.forward = row_parallel  # type: ignore[method-assign]
