"""The GRPO trainer over several processes: the policy sharded by its family's plan, sums over the data
ranks, and whole weights for the rollout engines.

In one process nothing is sharded and every helper here is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from titanpod.device import Backend
from titanpod.models import Transformer
from titanpod.parallel import ParallelConfig
from titanpod.parallel.torch_executor import ParallelModel, parallelize
from titanpod.recipes.families import sharding_plan
from titanpod.rl.grpo.metrics import RolloutTotals
from titanpod.rl.rollout import RolloutEngine, SyncReport, trainer_state


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


def shard_policy(
    policy: Transformer, family: str, parallel: ParallelConfig, backend: Backend, world_size: int
) -> TrainerSharding:
    """Shard ``policy`` in place by ``family``'s plan over every process (under torchrun); in one process leave it."""
    device = policy.tok_embeddings.weight.device
    if world_size == 1:
        return TrainerSharding(None, device)
    return TrainerSharding(parallelize(policy, sharding_plan(family), parallel, backend), device)


def whole_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s weights under plain parameter names, each whole: sharded ones are gathered (a collective, so
    every process must call it), others are the model's own tensors."""
    return {
        name: tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        for name, tensor in trainer_state(model).items()
    }


@torch.no_grad()
def sync_engine(model: nn.Module, engine: RolloutEngine, version: int) -> SyncReport:
    """Copy ``model``'s whole weights into ``engine`` as ``version``; the engine verifies them by checksum.

    Every process calls it (gathering sharded weights is a collective); each syncs its own engine.
    """
    return engine.load_weights(whole_weights(model), version)
