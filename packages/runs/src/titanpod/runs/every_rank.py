"""Rank 0's refusal raised on every rank, so that no rank waits for one that has stopped."""

from __future__ import annotations

import torch.distributed as dist


def raise_on_every_rank(problem: BaseException | None) -> None:
    """Raise rank 0's ``problem`` on every rank (under torchrun every rank must call it), so the other ranks stop
    too instead of waiting for rank 0; nothing when rank 0 had none."""
    if dist.is_initialized():
        shared = [problem]
        dist.broadcast_object_list(shared, src=0)
        problem = shared[0]
    if problem is not None:
        raise problem
