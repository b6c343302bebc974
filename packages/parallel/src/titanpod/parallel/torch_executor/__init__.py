"""The torch executor: a sharding plan applied with DTensor parameters and functional collectives."""

from titanpod.parallel.torch_executor.apply import ParallelModel, parallelize, unshard
from titanpod.parallel.torch_executor.materialize import RegionValues, local_region

__all__ = ["ParallelModel", "RegionValues", "local_region", "parallelize", "unshard"]
