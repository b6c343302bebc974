"""One bucket's differentiable all-gather, split into a start and a finish so it can be prefetched.

``start_gather`` launches the all-gather of a bucket's packed shards and returns at once;
``finish_gather`` waits for it and cuts the whole parameters out. Between the two, other work
(the previous block's compute) can run while the bucket travels. Going back, the gradients of
the whole parameters reach ``start_gather`` packed as one [R x T] tensor (autograd does the
packing, see ``bucket_layout``) and go through one reduce-scatter averaging over the shard
ranks, then one all-reduce averaging over the replica ranks (HSDP), which is what the
parameters' ``Partial("avg")`` gradient placements ask for.

The collectives are the ``_c10d_functional`` ops themselves, so a traced step holds one
``all_gather_into_tensor`` and one ``reduce_scatter_tensor`` per bucket, each with its
``wait_tensor`` where the value is first needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from titanpod.parallel.torch_executor.bucket_layout import BucketLayout

_c10d = torch.ops._c10d_functional


@dataclass(frozen=True)
class ProcessGroupRef:
    """A process group as the functional collectives name it (a string survives tracing)."""

    name: str
    """The group's registered name."""
    size: int
    """Its number of ranks."""


@dataclass(frozen=True)
class BucketComms:
    """Everything one bucket's collectives need: its layout, its groups and its dtypes."""

    layout: BucketLayout
    """Where each parameter's shard sits in the bucket."""
    shards: ProcessGroupRef
    """The ranks that each hold one shard of every parameter (the data-shard axes, flattened)."""
    replicas: ProcessGroupRef | None
    """The ranks that hold the same shards (``dp_replicate``); their gradients are averaged too."""
    param_dtype: torch.dtype
    """Dtype the shards are gathered and computed in."""
    reduce_dtype: torch.dtype
    """Dtype the gradients are reduced in."""
    stored_dtype: torch.dtype
    """Dtype of the stored shards, and so of their gradients."""


class _StartGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, comms: BucketComms, *shards: torch.Tensor) -> torch.Tensor:
        ctx.comms = comms
        packed_T = comms.layout.pack_shards(shards, comms.param_dtype)
        return _c10d.all_gather_into_tensor(packed_T, comms.shards.size, comms.shards.name)

    @staticmethod
    def backward(ctx: Any, grad_RT: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        comms: BucketComms = ctx.comms
        grad_RT = grad_RT.contiguous().to(comms.reduce_dtype)
        grad_T = _c10d.wait_tensor(_c10d.reduce_scatter_tensor(grad_RT, "avg", comms.shards.size, comms.shards.name))
        if comms.replicas is not None:
            grad_T = _c10d.wait_tensor(_c10d.all_reduce(grad_T, "avg", comms.replicas.name))
        grad_T = grad_T.to(comms.stored_dtype)
        return (None, *comms.layout.unpack_shards(grad_T))


class _Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, pending: torch.Tensor) -> torch.Tensor:
        return _c10d.wait_tensor(pending).view_as(pending)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def start_gather(comms: BucketComms, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """Launch the all-gather of this rank's ``shards`` (plain local tensors, in the layout's order).

    Returns the [R x T] buffer it fills; read it only through ``finish_gather``.
    """
    return _StartGather.apply(comms, *shards)


def finish_gather(comms: BucketComms, pending: torch.Tensor) -> list[torch.Tensor]:
    """Wait for a bucket started by ``start_gather`` and return its whole parameters, in order."""
    return comms.layout.unpack_gathered(_Wait.apply(pending))


def drain(pending: torch.Tensor) -> None:
    """Wait for a started gather whose result will not be used (every launched collective is waited)."""
    _c10d.wait_tensor(pending.detach())
