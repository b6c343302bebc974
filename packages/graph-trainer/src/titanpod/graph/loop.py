"""The training loop: steps in the configured mode, a schedule, progress, metrics and a NaN guard.

Legend: B batch, S sequence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch import nn

from titanpod.device import Backend, ChipSpec, process_info
from titanpod.graph.config import TrainConfig
from titanpod.graph.loss_metrics import DROPPED_TOKENS
from titanpod.graph.metrics import MfuGauge, StepMetrics
from titanpod.graph.profiling import StepProfiler
from titanpod.graph.schedule import lr_multiplier
from titanpod.graph.step_base import Batch, StepOutput, TrainStep
from titanpod.graph.step_driver import StepCheck, drive_steps
from titanpod.graph.steps import build_step
from titanpod.graph.throughput import ThroughputMeter


class LossModel(Protocol):
    """A model that returns its training loss: what the loop needs of it."""

    def loss(self, tokens_BS: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
        """Mean loss over the batch's labelled tokens.

        A model trained on 3-tuple batches (packed documents) must also take
        ``document_ids_BS=`` [B, S], as ``titanpod.models.Transformer.loss`` does.
        """
        ...


@dataclass
class TrainSummary:
    """What a finished (or interrupted) training run did."""

    steps_done: int
    """Optimizer steps completed, counting those done before a resume."""
    losses: list[float]
    """Training loss of every step this call ran, in order."""
    tokens_per_second: float
    """Whole-job throughput over every step of this call but the first (which compiles and warms up): their tokens
    over the time from the first step's end to the last report (to the loop's end when steps ran after it); the
    last report's and the progress bar's figure (``titanpod.graph.throughput`` defines it)."""
    mfu: float
    """Model FLOPs utilisation over the same steps (``titanpod.graph.mfu`` of ``tokens_per_second``)."""
    peak_memory_gib: float | None
    """Peak memory of this process's device; ``None`` where the device does not report it."""
    wall_seconds: float
    """Wall time of the loop."""
    interrupted: bool = False
    """True when a signal (SIGINT, Ctrl-C; or SIGTERM) stopped the run before the last step."""
    stop_signal: int | None = None
    """The signal that stopped the run (``interrupted``): the first one after a stop at a step's end, the
    second after a stop at once; SIGINT for a ``KeyboardInterrupt`` no handler caught."""
    stopped_at_once: bool = False
    """True when the run stopped at once (a second signal, or a ``KeyboardInterrupt``), possibly inside a step:
    the weights may be half-updated and the data read ahead of ``steps_done``, so nothing may be saved from them."""
    stop_received_at: float | None = None
    """When the signal behind ``interrupted`` reached this process (``time.monotonic()``): a preempted machine's
    notice runs from then."""
    reports: list[StepMetrics] = field(default_factory=list)
    """Every metrics report written."""
    skipped_steps: list[int] = field(default_factory=list)
    """Steps whose update was skipped because the gradient norm was NaN or Inf."""
    stopped_because: str | None = None
    """Why the run stopped early on its own (a non-finite gradient norm or loss with ``skip_nonfinite`` off)."""
    start_step: int = 0
    """Steps done before this call (a resumed run); ``losses[0]`` is step ``start_step + 1``."""
    compile_seconds: float | None = None
    """Time the first step spent compiling the whole step (inductor; XLA on the xla lane), or loading it from the
    compiled-step cache (``compile_cache`` says which); ``None`` for steps that compile no whole program."""
    compile_cache: str | None = None
    """``hit``, ``miss`` or ``off``, with ``compile_seconds``."""
    peak_method: str = ""
    """Where the peak MFU divides by comes from (``ChipSpec.peak_method``), to be shown beside MFU."""


def _to_device(batch: Batch, backend: Backend, local_rank: int) -> Batch:
    """Every tensor of ``batch`` on the device of the process with this local rank."""
    if isinstance(batch, Mapping):
        return {name: backend.place_batch(tensor, local_rank) for name, tensor in batch.items()}
    return tuple(backend.place_batch(tensor, local_rank) for tensor in batch)  # type: ignore[return-value]


def _first_tensor_size(batch: Batch) -> int:
    return batch[0].numel() if not isinstance(batch, Mapping) else next(iter(batch.values())).numel()


def _progress(console: Console | None) -> Progress:
    return Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TextColumn("{task.fields[dropped]}"),
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
    step: TrainStep | None = None,
    start_step: int = 0,
    after_step: Callable[[int], None] | None = None,
    count_tokens: Callable[[Batch], int] | None = None,
    profiler: StepProfiler | None = None,
    stop_reason: Callable[[int], str | None] | None = None,
) -> TrainSummary:
    """Train ``model`` (which must have ``loss(tokens, labels)``) for ``config.steps`` steps.

    A batch is ``(tokens, labels)`` or ``(tokens, labels, document_ids)`` (see ``Batch``):
    with document ids, attention stays within each packed document.
    Each step takes ``config.grad_accum_steps`` batches from ``batches`` and runs them in
    ``config.step_mode`` (or through ``step``, when given: it owns the optimizer state).
    A resumed run passes ``start_step``, the steps already done: training continues at
    the next step of the schedule. ``after_step(step_number)`` runs after every step (to
    save checkpoints); the loop's reported losses cover only the steps it ran. Where ``stop_reason(step_number)``
    gives a reason after a step (every process must give the same), the run stops there with ``stopped_because``.
    The steps are driven by ``titanpod.graph.step_driver.drive_steps``, which owns signals, the stop on a
    non-finite step and the ``profiler``'s range.

    Sharded training: each process passes its own batches; ``data_parallel`` is the number
    of distinct data shards (global tokens = local tokens x ``data_parallel``), ``devices``
    the number of processes, and ``reduce_loss`` averages a loss over the data shards for
    reporting (times ``data_parallel``, it also sums an MoE model's dropped tokens over them).
    ``count_tokens(batch)`` says how many tokens a batch holds (default: the
    elements of its first tensor); ``flops_per_token`` is per such token. Gradients are
    reduced by the model's own sharding (titanpod.parallel).

    Batches go to this process's device, the one its local rank (torchrun's ``LOCAL_RANK``) selects on its host;
    the loop waits for that device and reports its memory.

    Losses stay on the device and are read back every ``config.log_every`` steps, so the
    loop waits for the device only when it reports. A step whose gradient norm is NaN or
    Inf changes nothing; it is counted as skipped, or, with ``skip_nonfinite`` off, ends
    the run with ``stopped_because`` set, as does a NaN or Inf loss (this check reads the
    device every step). SIGINT
    (Ctrl-C) or SIGTERM lets the step in flight finish, then stops and returns a summary
    marked ``interrupted`` with its ``stop_signal``; the model keeps the weights it reached.
    A second signal interrupts at once: the summary is also marked ``stopped_at_once``.
    """
    if start_step == 0:
        torch.manual_seed(config.seed)  # a resumed run keeps the random state its checkpoint restored
    train_step = step if step is not None else build_step(model, config, backend)
    local_rank = process_info().local_rank
    chip = backend.chip()
    gauge = MfuGauge(chip, flops_per_token, devices)
    pending: list[StepOutput] = []
    losses: list[float] = []
    reports: list[StepMetrics] = []
    skipped: list[int] = []
    dropped: list[int] = []  # dropped tokens of the steps read back since the last report (MoE models)

    def read_back(upto_step: int) -> torch.Tensor:
        """Bring the pending steps' losses and flags to the host (waits for the device)."""
        first = upto_step - len(pending) + 1
        window = torch.tensor([float(out.loss) for out in pending])
        applied = [bool(out.applied) for out in pending]
        skipped.extend(first + i for i, ok in enumerate(applied) if not ok)
        dropped.extend(round(float(out.metrics[DROPPED_TOKENS])) for out in pending if DROPPED_TOKENS in out.metrics)
        losses.extend(window.tolist())
        pending.clear()
        return window

    last_step = config.stop_at_step or config.steps
    count = count_tokens or _first_tensor_size
    meter = ThroughputMeter()

    def run_step(step_number: int) -> Callable[[], StepCheck]:
        micro_batches = [next(batches) for _ in range(config.grad_accum_steps)]
        if not backend.single_controller:  # a single controller's step places batches itself
            micro_batches = [_to_device(batch, backend, local_rank) for batch in micro_batches]
        out = train_step(micro_batches, config.lr * lr_multiplier(step_number, config))
        if reduce_loss is not None:
            out.loss = reduce_loss(out.loss)
            if DROPPED_TOKENS in out.metrics:  # a sum over the data shards: their mean x their number
                out.metrics[DROPPED_TOKENS] = reduce_loss(out.metrics[DROPPED_TOKENS].float()) * data_parallel
        pending.append(out)
        first = step_number == start_step + 1
        if first:
            backend.synchronize(local_rank)
        meter.step_done(sum(count(batch) for batch in micro_batches) * data_parallel, first)
        return lambda: StepCheck(bool(out.applied), float(out.loss), float(out.grad_norm))

    def reporting(step_number: int) -> bool:
        return step_number % config.log_every == 0 or step_number == last_step

    def report(step_number: int) -> None:
        if reporting(step_number):
            grad_norm = float(pending[-1].grad_norm)
            window = read_back(step_number)
            tps, elapsed = meter.report()
            metrics = StepMetrics(
                step=step_number,
                loss=float(window.mean()),
                grad_norm=grad_norm,
                lr=config.lr * lr_multiplier(step_number, config),
                tokens_per_second=tps,
                tflops_per_second=flops_per_token * tps / devices / 1e12,
                mfu=gauge(tps),
                peak_memory_gib=backend.memory_stats(local_rank).peak_gib,
                elapsed_seconds=elapsed,
                skipped_steps=len(skipped),
                dropped_tokens=sum(dropped) if dropped else None,
                **(_first_report_fields(train_step, chip) if not reports else {}),
            )
            dropped.clear()
            reports.append(metrics)
            if on_report is not None:
                on_report(metrics)
            shown = f"dropped {metrics.dropped_tokens:,}" if metrics.dropped_tokens else ""
            progress.update(task, loss=f"{metrics.loss:.4f}", tps=f"{tps:,.0f}", dropped=shown)
        progress.update(task, completed=step_number)
        if after_step is not None:
            with meter.outside_training():
                after_step(step_number)

    with _progress(console) as progress:
        task = progress.add_task("train", total=config.steps, completed=start_step, loss="-", tps="-", dropped="")
        outcome = drive_steps(
            run_step,
            start_step + 1,
            last_step,
            backend,
            skip_nonfinite=config.skip_nonfinite,
            after_step=report,
            profiler=profiler,
            stop_reason=stop_reason,
        )
    train_step.finish()
    backend.synchronize(local_rank)
    end = time.perf_counter()
    if pending:  # a step is pending only once it is done
        read_back(start_step + len(losses) + len(pending))
    tps_all = meter.overall(end)
    return TrainSummary(
        steps_done=start_step + len(losses),
        losses=losses,
        tokens_per_second=tps_all,
        mfu=gauge(tps_all),
        peak_method=chip.peak_method,
        peak_memory_gib=backend.memory_stats(local_rank).peak_gib,
        wall_seconds=end - meter.started,
        interrupted=outcome.interrupted,
        stop_signal=outcome.stop_signal,
        stopped_at_once=outcome.stopped_at_once,
        stop_received_at=outcome.stop_received_at,
        reports=reports,
        skipped_steps=skipped,
        stopped_because=outcome.stopped_because,
        start_step=start_step,
        **_compile_fields(train_step),
    )


def _compile_fields(train_step: Any) -> dict[str, Any]:
    """``compile_seconds`` and ``compile_cache`` of the step's last whole-program compile, where it made one."""
    report = getattr(train_step, "compile_report", None)
    if report is None:
        return {}
    return {"compile_seconds": report.seconds, "compile_cache": report.cache}


def _first_report_fields(train_step: Any, chip: ChipSpec) -> dict[str, Any]:
    """What only a run's first report holds: the peak MFU divides by, ``compile_seconds`` and
    ``compile_cache_hit`` where the step compiled, and the compiler's figures of a one-program step."""
    peak = {"mfu_peak": f"{chip.peak_flops / 1e12:.4g} TFLOP/s per device: {chip.peak_method}"}
    figures = getattr(train_step, "program_figures", None)
    if figures is not None:
        peak["program_memory_gib"] = figures.memory.total / 1024**3
        peak["estimated_step_seconds"] = train_step.estimated_step_seconds
    fields = _compile_fields(train_step)
    if not fields:
        return peak
    compiled = fields["compile_cache"] == "hit"
    return {**peak, "compile_seconds": fields["compile_seconds"], "compile_cache_hit": compiled}
