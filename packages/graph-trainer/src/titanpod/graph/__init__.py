"""titanpod.graph: the training step and loop, optimizer, schedules and metrics."""

from titanpod.graph.config import TrainConfig
from titanpod.graph.loop import Batch, LossModel, TrainSummary, train
from titanpod.graph.metrics import JsonlWriter, StepMetrics, mfu
from titanpod.graph.optimizer import build_adamw
from titanpod.graph.schedule import lr_multiplier

__all__ = [
    "Batch",
    "JsonlWriter",
    "LossModel",
    "StepMetrics",
    "TrainConfig",
    "TrainSummary",
    "build_adamw",
    "lr_multiplier",
    "mfu",
    "train",
]
