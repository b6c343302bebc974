"""The torch executor: a sharding plan applied with DTensor parameters and functional collectives."""

from titanpod.parallel.torch_executor.apply import ParallelModel, parallelize, unshard

__all__ = ["ParallelModel", "parallelize", "unshard"]
