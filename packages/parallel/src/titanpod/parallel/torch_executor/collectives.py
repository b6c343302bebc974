"""Differentiable collectives for tensor, sequence and expert parallelism.

Written with functional collectives, so they show up as ordinary ops in a traced graph.
Each op pairs what happens going forward with what its gradient needs going back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh

Step = Callable[[torch.Tensor, Any], torch.Tensor]


def _differentiable(name: str, forward: Step, backward: Step) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """An op that runs ``forward(x, arg)`` and whose gradient is ``backward(grad, arg)``."""

    def run_forward(ctx: Any, x: torch.Tensor, arg: Any) -> torch.Tensor:
        ctx.arg = arg
        return forward(x, arg)

    def run_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return backward(grad, ctx.arg), None

    function = type(name, (torch.autograd.Function,), {
        "forward": staticmethod(run_forward), "backward": staticmethod(run_backward)})  # fmt: skip
    return function.apply


def _same(x: torch.Tensor, _arg: Any) -> torch.Tensor:
    return x.view_as(x)


def _sum(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_reduce(x.contiguous(), "sum", mesh))


def _mean(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_reduce(x.contiguous(), "avg", mesh))


def _gather_sequence(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_gather_single(x.contiguous(), 1, mesh))


def _sum_scatter_sequence(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return funcol.wait_tensor(funcol.reduce_scatter_single(x.contiguous(), "sum", 1, mesh))


def _own_sequence_chunk(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return x.chunk(mesh.size(), dim=1)[mesh.get_local_rank()].contiguous()


def _scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale


enter_tensor_parallel = _differentiable("EnterTensorParallel", _same, _sum)
"""Enter a tp region with a tensor every tp rank holds whole: identity; the gradient sums over tp."""

leave_tensor_parallel = _differentiable("LeaveTensorParallel", _sum, _same)
"""Leave a tp region: sum the partial outputs over tp; the gradient passes through."""

gather_sequence = _differentiable("GatherSequence", _gather_sequence, _sum_scatter_sequence)
"""Enter a sequence-parallel region: [B, S/tp, ...] -> [B, S, ...]; the gradient reduce-scatters."""

scatter_sum_sequence = _differentiable("ScatterSumSequence", _sum_scatter_sequence, _gather_sequence)
"""Leave a sequence-parallel region: partial [B, S, ...] -> summed [B, S/tp, ...]; the gradient all-gathers."""

keep_sequence_chunk = _differentiable("KeepSequenceChunk", _own_sequence_chunk, _gather_sequence)
"""Start sequence parallelism from a tensor every rank holds whole: keep this rank's chunk."""

gather_sequence_for_all = _differentiable("GatherSequenceForAll", _gather_sequence, _own_sequence_chunk)
"""End sequence parallelism before work every tp rank repeats whole (head and loss); the
gradient, the same on every rank, is cut back to this rank's chunk."""

mean_over = _differentiable("MeanOver", _mean, _same)
"""The mean over a group. Its gradient reaches each rank's own input unscaled, which is right
when every rank computes the same loss from the mean and gradients are then averaged."""

scale_grad = _differentiable("ScaleGrad", _same, _scaled)
"""Identity going forward; multiplies the gradient by the given factor going back."""


def all_to_all(x: torch.Tensor, send_sizes: list[int], receive_sizes: list[int], mesh: DeviceMesh) -> torch.Tensor:
    """Send ``send_sizes[r]`` rows to rank r of ``mesh`` and receive ``receive_sizes[r]`` from it (differentiable)."""
    return funcol.wait_tensor(funcol.all_to_all_single_autograd(x.contiguous(), receive_sizes, send_sizes, mesh))
