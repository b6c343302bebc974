"""Every process of a job stops after the same step when a signal asks it to.

A scheduler's SIGTERM (or a Ctrl-C) reaches the processes of a torchrun job at slightly different
moments: one may see it before its end-of-step check and another only after, and a process that
stops while the others start the next step leaves them waiting in its collectives. At the end of
every step each process offers the signal it has received (0 for none) and all take the largest,
over a gloo group of their own: they stop together, at the step where the first of them saw it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from titanpod.device import Backend
from titanpod.graph.interrupt import StopRequest


class StopAgreement:
    """Agrees on a stop request across the job's processes (a no-op in a job of one process)."""

    def __init__(self, backend: Backend) -> None:
        several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        # A single controller drives every device from one process: nothing to agree with.
        self.group = dist.new_group(backend="gloo") if several and not backend.single_controller else None

    def signal(self, stop: StopRequest) -> int | None:
        """The signal the job stops for after this step, or ``None``; every process must call this each step."""
        return self.largest(stop.signum or 0) or None

    def largest(self, value: int) -> int:
        """The largest ``value`` any process offers; every process must call this at the same point."""
        if self.group is None:
            return value
        offered = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(offered, op=dist.ReduceOp.MAX, group=self.group)
        return int(offered.item())
