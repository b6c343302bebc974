"""Differentiable collectives for tensor and expert parallelism, written with functional
collectives so they show up as ordinary ops in a traced graph."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh


class _EnterTensorParallel(torch.autograd.Function):
    """Identity forward; the backward sums the input gradient over the tp ranks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        ctx.mesh = mesh
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return funcol.wait_tensor(funcol.all_reduce(grad.contiguous(), "sum", ctx.mesh)), None


class _LeaveTensorParallel(torch.autograd.Function):
    """Sum the partial output over the tp ranks; the backward passes the gradient through."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        return funcol.wait_tensor(funcol.all_reduce(x.contiguous(), "sum", mesh))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def enter_tensor_parallel(x: torch.Tensor, tp_mesh: DeviceMesh) -> torch.Tensor:
    """Mark ``x`` (equal on every tp rank) as the input of a tensor-parallel region."""
    return _EnterTensorParallel.apply(x, tp_mesh)


def leave_tensor_parallel(x: torch.Tensor, tp_mesh: DeviceMesh) -> torch.Tensor:
    """Add up a region's partial outputs over the tp ranks."""
    return _LeaveTensorParallel.apply(x, tp_mesh)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity forward; multiplies the gradient by ``scale`` on the way back."""
    return _ScaleGrad.apply(x, scale)


class _MeanForward(torch.autograd.Function):
    """Average over the group going forward; pass the gradient through unchanged going back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: DeviceMesh) -> torch.Tensor:
        return funcol.wait_tensor(funcol.all_reduce(x.contiguous(), "avg", group))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def mean_over(x: torch.Tensor, group: DeviceMesh) -> torch.Tensor:
    """The mean of ``x`` over ``group``. Its gradient reaches each rank's own ``x`` unscaled, which
    is right when every rank computes the same loss from the mean and gradients are then
    averaged over the same group."""
    return _MeanForward.apply(x, group)


def all_to_all(x: torch.Tensor, send_sizes: list[int], receive_sizes: list[int], mesh: DeviceMesh) -> torch.Tensor:
    """Send ``send_sizes[r]`` rows to rank r of ``mesh`` and receive ``receive_sizes[r]`` from it (differentiable)."""
    out = funcol.all_to_all_single_autograd(x.contiguous(), receive_sizes, send_sizes, mesh)
    return funcol.wait_tensor(out)


class _GatherSequence(torch.autograd.Function):
    """All-gather the sequence dimension; the backward reduce-scatters it (sums partial gradients)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        ctx.mesh = mesh
        return funcol.wait_tensor(funcol.all_gather_tensor(x.contiguous(), 1, mesh))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return funcol.wait_tensor(funcol.reduce_scatter_tensor(grad.contiguous(), "sum", 1, ctx.mesh)), None


class _ScatterSumSequence(torch.autograd.Function):
    """Sum partial outputs and keep this rank's sequence chunk; the backward all-gathers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        ctx.mesh = mesh
        return funcol.wait_tensor(funcol.reduce_scatter_tensor(x.contiguous(), "sum", 1, mesh))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return funcol.wait_tensor(funcol.all_gather_tensor(grad.contiguous(), 1, ctx.mesh)), None


class _KeepSequenceChunk(torch.autograd.Function):
    """Keep this rank's chunk of a tensor every rank holds whole; the backward all-gathers the chunks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        ctx.mesh = mesh
        return x.chunk(mesh.size(), dim=1)[mesh.get_local_rank()].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return funcol.wait_tensor(funcol.all_gather_tensor(grad.contiguous(), 1, ctx.mesh)), None


class _GatherSequenceForAll(torch.autograd.Function):
    """All-gather the sequence for a computation every rank repeats whole; the backward keeps the chunk."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        ctx.mesh = mesh
        return funcol.wait_tensor(funcol.all_gather_tensor(x.contiguous(), 1, mesh))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.chunk(ctx.mesh.size(), dim=1)[ctx.mesh.get_local_rank()].contiguous(), None


def gather_sequence(x: torch.Tensor, tp_mesh: DeviceMesh) -> torch.Tensor:
    """Enter a sequence-parallel region: [B, S/tp, ...] -> [B, S, ...]."""
    return _GatherSequence.apply(x, tp_mesh)


def scatter_sum_sequence(x: torch.Tensor, tp_mesh: DeviceMesh) -> torch.Tensor:
    """Leave a sequence-parallel region: partial [B, S, ...] -> summed [B, S/tp, ...]."""
    return _ScatterSumSequence.apply(x, tp_mesh)


def keep_sequence_chunk(x: torch.Tensor, tp_mesh: DeviceMesh) -> torch.Tensor:
    """Start sequence parallelism from a whole tensor: [B, S, ...] -> this rank's [B, S/tp, ...]."""
    return _KeepSequenceChunk.apply(x, tp_mesh)


def gather_sequence_for_all(x: torch.Tensor, tp_mesh: DeviceMesh) -> torch.Tensor:
    """End sequence parallelism before work every tp rank repeats whole (the output head and loss)."""
    return _GatherSequenceForAll.apply(x, tp_mesh)
