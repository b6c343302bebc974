"""A refusal raised on every rank (rank 0's, or any rank's), so that no rank waits for one that has stopped."""

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


def first_on_any_rank(problem: str | None) -> str | None:
    """The first rank's ``problem`` among those that have one, on every rank (under torchrun every rank must call
    it): a refusal one rank alone finds (its own data position) stops them all."""
    if not dist.is_initialized():
        return problem
    found: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(found, problem)
    return next((item for item in found if item is not None), None)
