"""titanpod.graph: the training step (eager, per-block, whole-step) and loop, optimizer, schedules, metrics."""

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
