"""titanpod.parallel: declarative sharding plans and their appliers.

A plan (``ShardingPlan``) says, per parameter, which tensor dimension each mesh axis
(``dp_replicate``, ``fsdp``, ``cp``, ``ep``, ``tp``) splits. The torch executor
(``titanpod.parallel.torch_executor.parallelize``) applies it with DTensor parameters
(SimpleFSDP), tensor-parallel regions and expert dispatch; the XLA executor
(``titanpod.parallel.xla_executor``) turns it into ``NamedSharding``s for XLA's SPMD partitioner.
"""

from titanpod.parallel.config import DATA_AXES, MESH_AXES, ParallelConfig, check_sequence_length
from titanpod.parallel.errors import PlanError
from titanpod.parallel.plan import ParamRule, ShardingPlan
from titanpod.parallel.plans import DECODER_PLAN, FLUX_PLAN

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
