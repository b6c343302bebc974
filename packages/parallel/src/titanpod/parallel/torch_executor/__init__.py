"""The torch executor: a sharding plan applied with DTensor parameters and functional collectives."""

from titanpod.parallel.torch_executor.apply import ParallelModel, parallelize, unshard
from titanpod.parallel.torch_executor.materialize import RegionValues, local_region
from titanpod.parallel.torch_executor.pipeline import PipelineModel, parallelize_pipeline
from titanpod.parallel.torch_executor.pipeline_stages import DecoderStage, PipelineLayout, pipeline_layout

__all__ = [
    "DecoderStage",
    "ParallelModel",
    "PipelineLayout",
    "PipelineModel",
    "RegionValues",
    "local_region",
    "parallelize",
    "parallelize_pipeline",
    "pipeline_layout",
    "unshard",
]
