"""The training loop: eager steps, a schedule, clipping, progress and metrics.

Legend: B batch, S sequence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch import nn
from torch.distributed.tensor import DTensor

from titanpod.device import Backend
from titanpod.graph.config import TrainConfig
from titanpod.graph.interrupt import stop_after_step
from titanpod.graph.metrics import StepMetrics, mfu
from titanpod.graph.optimizer import build_adamw
from titanpod.graph.schedule import lr_multiplier

Batch = tuple[torch.Tensor, torch.Tensor]
"""Inputs and labels, each [B, S] token ids."""


class LossModel(Protocol):
    """A model that returns its training loss: what the loop needs of it."""

    def loss(self, tokens_BS: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
        """Mean loss over the batch's labelled tokens."""
        ...


@dataclass
class TrainSummary:
    """What a finished (or interrupted) training run did."""

    steps_done: int
    """Optimizer steps completed."""
    losses: list[float]
    """Training loss of every completed step, in order."""
    tokens_per_second: float
    """Whole-job throughput over all steps but the first (which includes warm-up)."""
    mfu: float
    """Model FLOPs utilisation over the same steps."""
    peak_memory_gib: float
    """Peak memory of this process's device."""
    wall_seconds: float
    """Wall time of the loop."""
    interrupted: bool = False
    """True when the user stopped the run (Ctrl-C) before the last step."""
    reports: list[StepMetrics] = field(default_factory=list)
    """Every metrics report written."""


def _progress(console: Console | None) -> Progress:
    return Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=console is None,
    )


def train(
    model: nn.Module,
    batches: Iterator[Batch],
    config: TrainConfig,
    backend: Backend,
    *,
    flops_per_token: float,
    data_parallel: int = 1,
    devices: int = 1,
    reduce_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
    on_report: Callable[[StepMetrics], None] | None = None,
    console: Console | None = None,
) -> TrainSummary:
    """Train ``model`` (which must have ``loss(tokens, labels)``) for ``config.steps`` steps.

    Sharded training: each process passes its own batches; ``data_parallel`` is the number
    of distinct data shards (global tokens = local tokens x ``data_parallel``), ``devices``
    the number of processes, and ``reduce_loss`` averages a loss over the data shards for
    reporting. Gradients are reduced by the model's own sharding (titanpod.parallel).

    Losses stay on the device and are read back every ``config.log_every`` steps, so the
    loop waits for the device only when it reports. Ctrl-C lets the step in flight finish,
    then stops and returns a summary marked ``interrupted``; the model keeps the weights it
    reached. A second Ctrl-C interrupts at once.
    """
    if backend.lane == "xla":
        raise NotImplementedError(
            "The xla lane trains through a jitted functional step, which this eager loop is not; "
            "use lane cpu, cuda or tpu for this run."
        )
    device = backend.device()
    loss_model: LossModel = model  # type: ignore[assignment]
    optimizer = build_adamw(model, config)
    peak = backend.chip().peak_flops
    pending: list[torch.Tensor] = []
    losses: list[float] = []
    reports: list[StepMetrics] = []
    tokens_since, tokens_after_first = 0, 0
    interrupted = False
    start = last_report = time.perf_counter()
    first_step_end = start
    with _progress(console) as progress, stop_after_step() as stop:
        task = progress.add_task("train", total=config.steps, loss="-", tps="-")
        try:
            for step in range(1, config.steps + 1):
                tokens_BS, labels_BS = next(batches)
                tokens_BS, labels_BS = tokens_BS.to(device), labels_BS.to(device)
                lr = config.lr * lr_multiplier(step, config)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                loss = loss_model.loss(tokens_BS, labels_BS)
                loss.backward()
                max_norm = config.grad_clip if config.grad_clip > 0 else math.inf
                grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
                if isinstance(grad_norm, DTensor):
                    grad_norm = grad_norm.full_tensor()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                pending.append(loss.detach() if reduce_loss is None else reduce_loss(loss.detach()))
                step_tokens = tokens_BS.numel() * data_parallel
                tokens_since += step_tokens
                if step == 1:
                    backend.synchronize()
                    first_step_end = time.perf_counter()
                else:
                    tokens_after_first += step_tokens
                if step % config.log_every == 0 or step == config.steps:
                    window = torch.stack(pending).float().cpu()  # waits for the device
                    now = time.perf_counter()
                    losses.extend(window.tolist())
                    pending.clear()
                    tps = tokens_since / (now - last_report)
                    report = StepMetrics(
                        step=step,
                        loss=float(window.mean()),
                        grad_norm=float(grad_norm),
                        lr=lr,
                        tokens_per_second=tps,
                        tflops_per_second=flops_per_token * tps / devices / 1e12,
                        mfu=mfu(flops_per_token, tps, devices, peak),
                        peak_memory_gib=backend.memory_stats().peak_bytes / 1024**3,
                        elapsed_seconds=now - start,
                    )
                    reports.append(report)
                    if on_report is not None:
                        on_report(report)
                    tokens_since, last_report = 0, now
                    progress.update(task, loss=f"{report.loss:.4f}", tps=f"{tps:,.0f}")
                progress.update(task, completed=step)
                if stop.requested and step < config.steps:
                    interrupted = True
                    break
        except KeyboardInterrupt:  # a second Ctrl-C, or a signal outside the main thread
            interrupted = True
    backend.synchronize()
    end = time.perf_counter()
    losses.extend(t.item() for t in pending)  # a loss is pending only once its step is done
    timed = end - first_step_end
    tps_all = tokens_after_first / timed if tokens_after_first and timed > 0 else 0.0
    return TrainSummary(
        steps_done=len(losses),
        losses=losses,
        tokens_per_second=tps_all,
        mfu=mfu(flops_per_token, tps_all, devices, peak),
        peak_memory_gib=backend.memory_stats().peak_bytes / 1024**3,
        wall_seconds=end - start,
        interrupted=interrupted,
        reports=reports,
    )
