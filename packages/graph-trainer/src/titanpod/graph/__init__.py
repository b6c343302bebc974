"""titanpod.graph: the training step (eager, per-block, whole-step) and loop, optimizer, schedules, metrics."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from titanpod.graph.config import MEMORY_POLICIES, STEP_MODES, TrainConfig
    from titanpod.graph.loop import LossModel, TrainSummary, train
    from titanpod.graph.loss_windows import FirstLastMeans, first_last_means
    from titanpod.graph.memory_policy import ActivationPlan, apply_memory_policy
    from titanpod.graph.metrics import JsonlWriter, MfuGauge, PeakTooLowWarning, StepMetrics, TensorBoardWriter, mfu
    from titanpod.graph.optimizer import AdamWState, adamw_update_, init_adamw_state, total_grad_norm
    from titanpod.graph.profiling import ProfileConfig, StepProfiler
    from titanpod.graph.schedule import lr_multiplier
    from titanpod.graph.step_base import Batch, StepOutput, TrainStep
    from titanpod.graph.steps import EagerStep, WholeStep, build_step

_HOMES = {
    "MEMORY_POLICIES": "titanpod.graph.config",
    "STEP_MODES": "titanpod.graph.config",
    "TrainConfig": "titanpod.graph.config",
    "LossModel": "titanpod.graph.loop",
    "TrainSummary": "titanpod.graph.loop",
    "train": "titanpod.graph.loop",
    "FirstLastMeans": "titanpod.graph.loss_windows",
    "first_last_means": "titanpod.graph.loss_windows",
    "ActivationPlan": "titanpod.graph.memory_policy",
    "apply_memory_policy": "titanpod.graph.memory_policy",
    "JsonlWriter": "titanpod.graph.metrics",
    "MfuGauge": "titanpod.graph.metrics",
    "PeakTooLowWarning": "titanpod.graph.metrics",
    "StepMetrics": "titanpod.graph.metrics",
    "TensorBoardWriter": "titanpod.graph.metrics",
    "mfu": "titanpod.graph.metrics",
    "AdamWState": "titanpod.graph.optimizer",
    "adamw_update_": "titanpod.graph.optimizer",
    "init_adamw_state": "titanpod.graph.optimizer",
    "total_grad_norm": "titanpod.graph.optimizer",
    "ProfileConfig": "titanpod.graph.profiling",
    "StepProfiler": "titanpod.graph.profiling",
    "lr_multiplier": "titanpod.graph.schedule",
    "Batch": "titanpod.graph.step_base",
    "StepOutput": "titanpod.graph.step_base",
    "TrainStep": "titanpod.graph.step_base",
    "EagerStep": "titanpod.graph.steps",
    "WholeStep": "titanpod.graph.steps",
    "build_step": "titanpod.graph.steps",
}
"""Where each public name lives: imported on first use, so a module of this package that needs none of them
(a config dataclass the command line reads) is imported without the rest."""

__all__ = [
    "MEMORY_POLICIES",
    "STEP_MODES",
    "ActivationPlan",
    "AdamWState",
    "Batch",
    "EagerStep",
    "FirstLastMeans",
    "JsonlWriter",
    "LossModel",
    "MfuGauge",
    "PeakTooLowWarning",
    "ProfileConfig",
    "StepMetrics",
    "StepOutput",
    "StepProfiler",
    "TensorBoardWriter",
    "TrainConfig",
    "TrainStep",
    "TrainSummary",
    "WholeStep",
    "adamw_update_",
    "apply_memory_policy",
    "build_step",
    "first_last_means",
    "init_adamw_state",
    "loss_rows",
    "lr_multiplier",
    "mfu",
    "total_grad_norm",
    "train",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'titanpod.graph' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
