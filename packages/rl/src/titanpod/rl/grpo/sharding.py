"""The GRPO trainer over several processes: the policy sharded by its family's plan and sums over the data
ranks (the weights reach the rollout engines through ``titanpod.rl.rollout.streamed.sync_engine``).

In one process nothing is sharded and every helper here is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from titanpod.parallel.torch_executor import ParallelModel
from titanpod.rl.grpo.metrics import RolloutTotals
from titanpod.runs.placement import Placement


@dataclass
class TrainerSharding:
    """Where this process stands among the trainer's processes (``parallel`` is None in one process)."""

    parallel: ParallelModel | None
    """The sharded policy and its mesh, or None."""
    device: torch.device
    """This process's device (collectives of figures run there)."""

    @property
    def data_rank(self) -> int:
        """This process's data shard: which block of each step's prompts it samples and trains on."""
        return 0 if self.parallel is None else self.parallel.data_rank

    @property
    def data_ranks(self) -> int:
        """How many data shards the step's prompts split into."""
        return 1 if self.parallel is None else self.parallel.data_world

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` over the data ranks (a step's loss, as its ranks computed it)."""
        return value if self.parallel is None else self.parallel.mean_over_data(value)

    def sum_totals(self, totals: RolloutTotals) -> RolloutTotals:
        """``totals`` added over the data ranks (every rank gets the sum)."""
        if self.parallel is None or self.parallel.data_group is None:
            return totals
        values = torch.tensor(totals.as_list(), dtype=torch.float64, device=self.device)
        dist.all_reduce(values, group=self.parallel.data_group.get_group())
        return RolloutTotals.from_list(values.tolist())


def trainer_sharding(placement: Placement, device: torch.device) -> TrainerSharding:
    """Where this process stands, from the policy's placement (``titanpod.runs.placement``)."""
    return TrainerSharding(placement.sharded, device)
