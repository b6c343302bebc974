"""The training step of a pipeline-parallel model: a torch.distributed.pipelining schedule, then AdamW.

Legend: A micro-batches per step, B batch, S sequence, M model dim.

The step's micro-batches are the schedule's: the first stage reads their tokens, the last stage turns its
hidden states into each micro-batch's loss through the head, and the schedule (1F1B or interleaved 1F1B)
runs every stage's forward and backward in its order. Each micro-batch's loss is divided by A before its
backward, as the eager step does, so the gradients are the same. The gradient norm is the whole model's
(each pp rank's squared norm summed over the pp group), so clipping and the NaN/Inf guard decide alike on
every stage; the loss is the last stage's mean, sent to every rank of the pipeline.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

from titanpod.device import Backend
from titanpod.graph.capture import autocast_context
from titanpod.graph.config import TrainConfig
from titanpod.graph.optimizer import local_tensor, total_grad_norm
from titanpod.graph.step_base import Batch, StepOutput, TrainStep


class PipelineStep(TrainStep):
    """Eager forward and backward of this rank's pipeline stages under the layout's schedule; then AdamW.

    ``pipeline`` is a ``titanpod.parallel.torch_executor.PipelineModel`` (its ``model`` holds this rank's
    parameters under the whole model's names: the optimizer state and checkpoints use them). The schedule
    is built by the first call, for that batch shape, and again when the shape changes.
    """

    def __init__(self, pipeline: Any, config: TrainConfig, backend: Backend) -> None:
        if config.step_mode != "eager":
            raise ValueError(
                f"train.step_mode={config.step_mode!r} cannot run a pipeline-parallel model (parallel.pp > 1): "
                "its stages run under a pipeline schedule op by op. Set train.step_mode='eager'."
            )
        super().__init__(pipeline.model, config, backend)
        self.pipeline = pipeline
        self._schedule: Any = None
        self._shape: tuple[Any, ...] | None = None
        self._losses: list[torch.Tensor] = []
        stages = pipeline.stages
        self._first = stages[0].index == 0
        self._last_stage = next((s for s in stages if s.index == s.n_stages - 1), None)
        self._last_rank = (stages[0].n_stages - 1) % pipeline.layout.pp  # round-robin: the rank holding it

    def _stage_loss(self, h_BSM: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
        """The schedule's loss function: one micro-batch's loss, kept for reporting, divided by A for its backward."""
        assert self._last_stage is not None
        loss = self._last_stage.loss(h_BSM, labels_BS)
        self._losses.append(loss.detach())
        return loss / self.pipeline.layout.microbatches

    def _build_schedule(self, batch: int, seq_len: int, device: torch.device) -> Any:
        """Pipeline stages with their activations' shapes given (no shape inference at run time), and the schedule."""
        layout = self.pipeline.layout
        stages = []
        for stage in self.pipeline.stages:
            dim = stage.args.dim
            dtype = stage.activation_dtype
            hidden = torch.empty(
                batch, seq_len // stage.sequence_split, dim, dtype=dtype, device="meta", requires_grad=True
            )
            inputs = torch.empty(batch, seq_len, dtype=torch.long, device="meta") if stage.index == 0 else hidden
            outputs = (
                torch.empty(batch, seq_len, dim, dtype=dtype, device="meta", requires_grad=True)
                if stage.index == layout.n_stages - 1
                else hidden
            )
            stages.append(
                PipelineStage(
                    stage,
                    stage.index,
                    layout.n_stages,
                    device,
                    input_args=inputs,
                    output_args=outputs,
                    group=self.pipeline.pp_group,
                )
            )
        if layout.schedule == "1f1b":
            return Schedule1F1B(stages[0], layout.microbatches, loss_fn=self._stage_loss, scale_grads=False)
        return ScheduleInterleaved1F1B(stages, layout.microbatches, loss_fn=self._stage_loss, scale_grads=False)

    def __call__(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        layout = self.pipeline.layout
        if len(micro_batches) != layout.microbatches:
            raise ValueError(
                f"The pipeline runs {layout.microbatches} micro-batches a step but got {len(micro_batches)}: "
                "train.grad_accum_steps and parallel.pp_microbatches must agree."
            )
        if any(not isinstance(batch, tuple) for batch in micro_batches):
            raise ValueError("A pipeline step takes (tokens, labels[, document_ids]) batches, not named tensors.")
        tokens = torch.cat([batch[0] for batch in micro_batches])
        labels = torch.cat([batch[1] for batch in micro_batches])
        ids = [batch[2] for batch in micro_batches if len(batch) == 3]
        if ids and len(ids) != len(micro_batches):
            raise ValueError("The micro-batches of one step must all carry document ids, or none of them.")
        kwargs = {"document_ids_BS": torch.cat(ids)} if ids else {}
        batch_rows, seq_len = micro_batches[0][0].shape
        shape = (batch_rows, seq_len, bool(ids))
        if self._schedule is None or self._shape != shape:
            self._schedule = self._build_schedule(batch_rows, seq_len, local_tensor(self.params[0]).device)
            self._shape = shape
        args = (tokens,) if self._first else ()
        target = labels if self._last_stage is not None else None
        self._losses.clear()
        with autocast_context(self.config, self.backend.device_type):
            self._schedule.step(*args, target=target, return_outputs=False, **kwargs)
        grads = self.gradients()
        group = self.pipeline.pp_group
        with torch.no_grad():
            squared = total_grad_norm(grads).square()
            dist.all_reduce(squared, group=group)
            grad_norm = squared.sqrt()
        applied = self.update_(grads, grad_norm, lr)
        with torch.no_grad():
            if self._losses:
                loss = torch.stack(self._losses).mean()
            else:
                loss = torch.zeros((), dtype=torch.float32, device=grad_norm.device)
            dist.broadcast(loss, group=group, group_src=self._last_rank)
        for param in self.params:
            param.grad = None
        self._losses.clear()
        self.backend.end_step()
        return StepOutput(loss, grad_norm, applied, {})
