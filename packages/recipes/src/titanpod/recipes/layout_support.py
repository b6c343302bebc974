"""Which layouts each runner trains, on which kind of lane: the one table the runners, the dry run and their
error messages read.

A layout is the lane's kind (one process a device, or one controller for every device), the parallel
degrees and the step mode. A runner that cannot train a layout refuses it before any work, naming the field
and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from titanpod.graph import TrainConfig
from titanpod.parallel import ParallelConfig, PlanError

Runner = Literal["pretrain", "sft", "grpo", "diffusion"]
"""The runners: pretraining, supervised fine-tuning, GRPO and diffusion (FLUX) training."""


class LayoutTraits(Protocol):
    """What the table asks of a lane: a backend class or instance, or ``titanpod.device.backend_class(lane)``."""

    single_controller: bool
    """One process drives every device and the compiler partitions the step."""
    supports_pipeline: bool
    """Pipeline stages are built on the lane."""
    traces_with_jax: bool
    """The step is one JAX program (where AdamW's moments can live in host memory)."""


@dataclass(frozen=True)
class RunnerSupport:
    """The layouts one runner trains."""

    single_controller: bool
    """Runs on a lane where one process drives every device (the xla lane)."""
    pipeline: bool
    """Trains with pipeline stages (``parallel.pp`` above 1), on lanes that build them."""
    context_parallel: bool
    """Splits sequences over ranks (``parallel.cp`` above 1)."""
    step_modes: tuple[str, ...]
    """The ``train.step_mode`` values it runs."""
    one_process_mesh: bool = False
    """Runs one process over every device of a lane that partitions by annotations (torch_xla's SPMD)."""


ALL_STEP_MODES = ("eager", "per_block", "whole_step")
"""Every step mode of ``titanpod.graph.TrainConfig``."""

RUNNER_SUPPORT: dict[Runner, RunnerSupport] = {
    "pretrain": RunnerSupport(
        single_controller=True, pipeline=True, context_parallel=True, step_modes=ALL_STEP_MODES, one_process_mesh=True
    ),
    "sft": RunnerSupport(single_controller=False, pipeline=False, context_parallel=True, step_modes=ALL_STEP_MODES),
    "grpo": RunnerSupport(single_controller=False, pipeline=False, context_parallel=False, step_modes=ALL_STEP_MODES),
    "diffusion": RunnerSupport(
        single_controller=True, pipeline=False, context_parallel=False, step_modes=ALL_STEP_MODES
    ),
}
"""What each runner trains. Every other combination of degrees is the sharding plan's to accept or refuse."""

RUNNER_NAMES: dict[Runner, str] = {
    "pretrain": "Pretraining",
    "sft": "SFT",
    "grpo": "GRPO",
    "diffusion": "Diffusion training",
}
"""Each runner as its messages name it."""


def layout_problem(
    runner: Runner, lane: str, traits: LayoutTraits, parallel: ParallelConfig, train: TrainConfig
) -> str | None:
    """Why ``runner`` cannot train this layout on ``lane`` (whose traits are ``traits``), with the fix; ``None``
    when it can."""
    support, name = RUNNER_SUPPORT[runner], RUNNER_NAMES[runner]
    if traits.single_controller and not support.single_controller:
        return (
            f"{name} runs on lanes where each process drives one device (cpu, cuda, tpu); the {lane} lane drives "
            "every device from one process and is not available for it yet: choose another with --device.lane."
        )
    if parallel.pp > 1 and not support.pipeline:
        return f"{name} does not train with pipeline stages: set parallel.pp to 1 (shard with fsdp or tp)."
    if parallel.pp > 1 and not traits.supports_pipeline:
        return (
            f"parallel.pp={parallel.pp} on the {lane} lane: pipeline stages run with the torch executor under "
            "torchrun (cpu, cuda, tpu lanes); set device.lane to one of those, or parallel.pp to 1."
        )
    if parallel.cp > 1 and not support.context_parallel:
        return f"{name} does not split sequences over ranks: set parallel.cp to 1 (shard with fsdp or tp)."
    if train.optimizer_offload and not traits.traces_with_jax:
        return (
            f"train.optimizer_offload keeps AdamW's moments in host memory inside the xla lane's one JAX program; "
            f"the {lane} lane has no such step: use --device.lane xla, or drop --train.optimizer-offload."
        )
    if train.step_mode not in support.step_modes:
        return (
            f"{name} takes train.step_mode {' or '.join(support.step_modes)}; {train.step_mode} is not available "
            "for it yet."
        )
    return None


def check_layout(runner: Runner, lane: str, traits: LayoutTraits, parallel: ParallelConfig, train: TrainConfig) -> None:
    """``PlanError`` with ``layout_problem``'s message when ``runner`` cannot train this layout on ``lane``."""
    problem = layout_problem(runner, lane, traits, parallel, train)
    if problem is not None:
        raise PlanError(problem)
