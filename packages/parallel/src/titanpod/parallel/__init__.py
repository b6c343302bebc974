"""titanpod.parallel: declarative sharding plans and their appliers.

A plan (``ShardingPlan``) says, per parameter, which tensor dimension each mesh axis
(``dp_replicate``, ``fsdp``, ``cp``, ``ep``, ``tp``) splits. The torch executor
(``titanpod.parallel.torch_executor.parallelize``) applies it with DTensor parameters
(SimpleFSDP), tensor-parallel regions and expert dispatch; the XLA executor
(``titanpod.parallel.xla_executor``) turns it into ``NamedSharding``s for XLA's SPMD partitioner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from titanpod.parallel.config import DATA_AXES, MESH_AXES, ParallelConfig, check_sequence_length
    from titanpod.parallel.errors import PlanError
    from titanpod.parallel.plan import ParamRule, ShardingPlan
    from titanpod.parallel.plans import DECODER_PLAN, FLUX_PLAN

_HOMES = {
    "DATA_AXES": "titanpod.parallel.config",
    "MESH_AXES": "titanpod.parallel.config",
    "ParallelConfig": "titanpod.parallel.config",
    "check_sequence_length": "titanpod.parallel.config",
    "PlanError": "titanpod.parallel.errors",
    "ParamRule": "titanpod.parallel.plan",
    "ShardingPlan": "titanpod.parallel.plan",
    "DECODER_PLAN": "titanpod.parallel.plans",
    "FLUX_PLAN": "titanpod.parallel.plans",
}
"""Where each public name lives: imported on first use, so a module of this package that needs none of them
(a config dataclass the command line reads) is imported without the rest."""

__all__ = [
    "DATA_AXES",
    "DECODER_PLAN",
    "FLUX_PLAN",
    "MESH_AXES",
    "ParallelConfig",
    "ParamRule",
    "PlanError",
    "ShardingPlan",
    "check_sequence_length",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'titanpod.parallel' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
