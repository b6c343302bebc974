"""One run session for every trainer: what pretraining, SFT, diffusion and GRPO runs share.

A trainer builds what is its own (data, model, step, evaluation and sample callbacks) and hands
the rest to a ``RunSession``::

    with RunSession(recipe, backend, console) as session:
        step = build_step(model, recipe.train, backend)
        session.resume(model, step, batches)  # continues from a checkpoint when there is one
        summary = session.train(batches, flops_per_token=..., after_step=validate, at_end=score)
        session.save_final_weights(summary, lambda: save_model(model, family, session.run_dir / "model"))

The session owns the run directory and its lock (``titanpod.runs.session_dir``), the console (rank 0 only), the
metrics writers and the loss plot (``titanpod.runs.session_writers``), the trainer-state checkpoints, resume and
the final weights, each save completed through a signal (``titanpod.runs.session_saves``), a profile of the
steps ``profile.steps`` names, and, on a clean exit, the process group's teardown.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from torch import nn

from titanpod.checkpoint import Checkpointer
from titanpod.device import Backend, ensure_process_group, process_info
from titanpod.graph import JsonlWriter, StepMetrics, StepProfiler, TensorBoardWriter, TrainStep, TrainSummary, train
from titanpod.graph.steps import Batch
from titanpod.graph.stop_agreement import StopAgreement
from titanpod.graph.tracking import WandbWriter
from titanpod.recipes.recipe import RunRecipe
from titanpod.runs.folder_locks import FolderLocks
from titanpod.runs.peer_loss import report_lost_peer, say_anywhere
from titanpod.runs.preemption_watch import PreemptionWatch
from titanpod.runs.run_folder import as_recorded
from titanpod.runs.save_clock import SaveClock
from titanpod.runs.session_dir import HeldRunDir, run_dir_of
from titanpod.runs.session_saves import ResumableData, RunSaves, Written
from titanpod.runs.session_writers import RunWriters

PROFILE_FOLDER = "profile"


class RunSession:
    """A run's directory, console, writers, checkpoints, final weights and teardown, for any trainer.

    Open it with ``with`` on every rank. In order, a trainer calls ``resume`` once (also when it
    starts fresh: it registers what the checkpoints hold), ``train`` once, then
    ``save_final_weights``. Leaving the block waits for a background checkpoint save in flight
    and closes the writers whatever happened; a clean exit also waits for every rank and destroys
    the process group.
    """

    def __init__(
        self,
        recipe: RunRecipe,
        backend: Backend,
        console: Console | None = None,
        data_files: Mapping[str, Any] | None = None,
    ) -> None:
        """Join the process group under torchrun (single-controller lanes run one process), claim the run
        directory (``titanpod.runs.session_dir``: rank 0 holds its lock until the session ends, refuses an earlier run's
        files unless this run resumes or starts over), refuse ``checkpoint.resume never`` where checkpoints
        already are (before anything else is written), and remove checkpoints whose save never completed. A start
        that fails here, or before ``resume`` accepts the run (a refused checkpoint, too little disk space), leaves
        no run directory it made; files are written at the first line of metrics, so a refused run in a folder
        that was there leaves no ``recipe.json``, ``metrics.jsonl`` or TensorBoard file either.

        ``console`` is used on rank 0 only; pass the same on every rank or ``None`` for a quiet run. ``data_files``
        is the fingerprint of the data files the run reads (``titanpod.data.fingerprint``), which every checkpoint
        records for a resume to compare.
        """
        asked = recipe
        self.recipe = recipe = as_recorded(recipe)
        """The recipe the run follows (``output.start_over`` off: done once, never recorded as on)."""
        self.backend = backend
        """The lane the run trains on."""
        if process_info().world_size > 1 and not backend.single_controller:
            ensure_process_group(backend)
        self.info = process_info()
        """This process's place in the job."""
        self.console = console if self.info.is_main else None
        """The console on rank 0; ``None`` on other ranks and for a quiet run."""
        self.run_dir = run_dir_of(recipe)
        """The run directory (the same path on every rank)."""
        rerun = f"--output.run-name {shlex.quote(self.run_dir.name)}"  # the same run, however it was named
        self.checkpointer = Checkpointer(self.run_dir, recipe.checkpoint, recipe.to_json(), self.say, data_files, rerun)
        """The trainer-state checkpoints under ``<run>/checkpoints``, or ``checkpoint.dir`` (a path or URL)."""
        self.held_dir = HeldRunDir(asked, self.run_dir, self.checkpointer.folder, self.info.is_main, self.say)
        """The run directory while the session holds it (rank 0's lock, what a refused start removes)."""
        try:
            self._open(recipe, backend)
        except BaseException:
            self.held_dir.remove_made()  # made moments ago, it holds nothing but what this failed start wrote
            self.held_dir.let_go()
            raise

    def _open(self, recipe: RunRecipe, backend: Backend) -> None:
        """The rest of ``__init__``, with the run directory held: a failure here lets go of it."""
        self.checkpointer.check_fresh_start(self.run_dir)
        self.run_writers = RunWriters(self.run_dir, recipe.name, self.info.is_main, self.console is None, self.say)
        """Where the run's reports, figures and images go (rank 0)."""
        self.run_writers.open(recipe)
        self.profiler = None
        """Traces the steps ``profile.steps`` names into ``<run>/profile`` (every rank its own file); ``None``
        when profiling is off."""
        if recipe.profile.steps is not None:
            folder = self.run_dir / PROFILE_FOLDER
            self.profiler = StepProfiler(recipe.profile, folder, backend.lane, self.info.rank, self.say)
        self.checkpointer.remove_partial()
        self.agreement = StopAgreement(backend)
        """Agrees with the job's other processes (a gloo group of its own under torchrun)."""
        self.saves = RunSaves(
            recipe, self.checkpointer, self.run_dir, self.info, self.say, self._report_lost_peer, self.agreement.largest
        )
        """The checkpoints, resuming from one, and the final weights."""
        self.save_clock = SaveClock(recipe.checkpoint.every_seconds, self.agreement)
        """When a save is due by time (``checkpoint.every_seconds``)."""
        self.preemption = PreemptionWatch(say=self.say).start() if recipe.checkpoint.watch_preemption else None
        """Turns the cloud's preemption notice into SIGTERM (``checkpoint.watch_preemption``)."""
        self._reported_error: Exception | None = None

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process that prints and writes shared files."""
        return self.info.is_main

    @property
    def start_step(self) -> int:
        """Steps done before this run started (set by ``resume``)."""
        return self.saves.start_step

    @property
    def model(self) -> nn.Module | None:
        """The trained module whose parameters the checkpoints hold (set by ``resume``)."""
        return self.saves.model

    @property
    def step(self) -> TrainStep | None:
        """The training step whose optimizer state the checkpoints hold (set by ``resume``)."""
        return self.saves.step

    @property
    def writers(self) -> list[JsonlWriter | TensorBoardWriter | WandbWriter]:
        """The metrics writers (rank 0 only): ``metrics.jsonl``, ``tensorboard/`` with ``output.tensorboard``,
        and a W&B run with ``output.wandb``."""
        return self.run_writers.all

    @property
    def trackers(self) -> list[TensorBoardWriter | WandbWriter]:
        """The writers that also take the recipe, images and the final figures (TensorBoard, W&B)."""
        return self.run_writers.trackers

    @property
    def lock(self) -> FolderLocks | None:
        """Rank 0's hold on the run directory and the checkpoint folder, given back when the session ends
        (``None`` on other ranks)."""
        return self.held_dir.lock

    @property
    def devices(self) -> int:
        """Devices one training step spans (every host device on a single controller, else one per process)."""
        return self.backend.devices_in_job(self.info.world_size)

    def say(self, message: str) -> None:
        """Print ``message`` (rich markup) on rank 0's console; nothing elsewhere."""
        if self.console is not None:
            self.console.print(message, soft_wrap=True)

    def write_report(self, report: StepMetrics) -> None:
        """Append a training report to every writer (rank 0)."""
        self.run_writers.write_report(report)

    def write_scalars(self, step_number: int, values: dict[str, float]) -> None:
        """Append named figures at ``step_number`` (a validation loss, an accuracy) to every writer (rank 0)."""
        self.run_writers.write_scalars(step_number, values)

    def write_image(self, step_number: int, name: str, path: Path) -> None:
        """Add the PNG file at ``path`` (a sample grid) as image ``name`` at ``step_number`` to TensorBoard and
        W&B (rank 0)."""
        self.run_writers.write_image(step_number, name, path)

    def write_summary(self, summary: TrainSummary) -> None:
        """Hand the run's final figures (``titanpod.graph.tracking.final_figures``) to TensorBoard (as the
        hyper-parameters' metrics) and W&B (as the run's summary), rank 0."""
        self.run_writers.write_summary(summary)

    def resume(
        self,
        model: nn.Module,
        step: TrainStep,
        data: ResumableData,
        data_state: Callable[[], dict[str, Any]] | None = None,
    ) -> int:
        """Register what the checkpoints hold and continue from the checkpoint ``checkpoint.resume`` names.

        ``model`` is the module ``step`` trains (its parameters, sharded or not, are loaded in place),
        ``data`` the batches whose position is restored. ``data_state`` returns the position to save
        (default ``data.state_dict``); every rank calls it at each save, so it may be a collective
        (``titanpod.data.gather_data_state``). Returns the steps already done (0 when starting fresh).
        Every rank must call it. Once the checkpoint is accepted (or the run starts fresh), rank 0 writes
        ``recipe.json``, keeping a different earlier one in ``recipe-history/``.
        """
        folder = self.saves.resume(model, step, data, data_state)
        self.run_writers.set_aside_after(self.start_step)
        self.held_dir.accept(self.recipe.to_json())
        if folder is None:
            return self.start_step
        steps = self.recipe.train.steps
        self.say(f"resumed from {folder}: {self.start_step} of {steps} steps done")
        if self.start_step >= steps:
            self.say("nothing left to train: raise --train.steps to continue this run")
        return self.start_step

    def save_checkpoint(self, step_number: int) -> None:
        """Save the trainer state after ``step_number`` steps (every rank; in the background with
        ``checkpoint.async_save``). A second save of the same step does nothing."""
        self.saves.save_checkpoint(step_number)
        self.save_clock.saved()

    def save_due(self, step_number: int) -> bool:
        """Whether a checkpoint is due after ``step_number``: every ``checkpoint.every`` steps, or once
        ``checkpoint.every_seconds`` have passed since the last save (every process must ask after each step)."""
        every = self.recipe.checkpoint.every
        by_time = self.save_clock.due()
        return by_time or bool(every and step_number % every == 0)

    def train(
        self,
        batches: Any,
        *,
        flops_per_token: float,
        data_parallel: int = 1,
        reduce_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
        after_step: Callable[[int], None] | None = None,
        at_end: Callable[[TrainSummary], None] | None = None,
        count_tokens: Callable[[Batch], int] | None = None,
    ) -> TrainSummary:
        """Train the registered model with ``titanpod.graph.train`` from the resumed step to ``train.steps``.

        Reports go to the writers and the console. After every step ``after_step(step_number)`` runs
        (the trainer's validation or samples), then the interval checkpoint and a poll of a background
        save. After the loop ``at_end(summary)`` runs (a final evaluation; also after an interrupt, so
        it reads ``summary.interrupted``), then ``save_at_end``; after a signal the checkpoint comes first
        (a scheduler's grace period is short), and after a stop at once ``at_end`` does not run. Then rank 0
        draws ``loss.png`` (``draw_loss_plot``).
        ``data_parallel`` and ``reduce_loss`` are as in ``titanpod.graph.train``; the device count is
        the session's. A background save in flight is completed before this returns or raises.
        """
        model, step = self.saves.registered()
        profiler = self.profiler

        def after_each(step_number: int) -> None:
            if after_step is not None:
                after_step(step_number)
            if self.save_due(step_number):
                self.save_checkpoint(step_number)
            self.saves.poll()

        try:
            summary = train(
                model,
                batches,
                self.recipe.train,
                self.backend,
                flops_per_token=flops_per_token,
                data_parallel=data_parallel,
                devices=self.devices,
                reduce_loss=reduce_loss,
                on_report=self.write_report,
                console=self.console,
                step=step,
                start_step=self.start_step,
                after_step=after_each,
                count_tokens=count_tokens,
                profiler=profiler,
                stop_reason=self.saves.stop_reason,
            )
            if at_end is not None and not summary.interrupted:
                at_end(summary)
            with self.saves.saving_through_a_signal("the last checkpoint"):
                self.save_at_end(summary)
            if at_end is not None and summary.interrupted and not summary.stopped_at_once:
                at_end(summary)
            self.draw_loss_plot()
            self.write_summary(summary)
        except Exception as error:
            self._report_lost_peer(error)  # at once: torchrun's agent stops the survivors moments later
            raise
        finally:
            if profiler is not None:
                profiler.close()  # a trace cut short by a stop is still written
            self.checkpointer.wait()  # a background save in flight is completed, whatever happened
        return summary

    def draw_loss_plot(self) -> Path | None:
        """Rank 0: draw ``loss.png`` in the run directory (training and validation loss, and the learning rate,
        titled with the recipe's name) from ``metrics.jsonl``, which a resumed run appends to: the plot covers the
        whole run. Returns its path; ``None`` on other ranks, before any report, and when it cannot be drawn,
        which is a warning and never a failed run."""
        return self.run_writers.draw_loss_plot()

    def save_at_end(self, summary: TrainSummary) -> None:
        """The at-end checkpoint (``checkpoint.at_end``) when this run trained a step; after a signal, a line
        saying where the run stopped and what it saved (every rank calls it).

        A run stopped at once (``summary.stopped_at_once``) saves nothing: its weights may be half-updated
        and its data read ahead of its step, and a checkpoint must pair the weights after step N with the
        data position after exactly N steps. The newest checkpoint, from an earlier save, stays the one to resume.
        """
        self.saves.save_at_end(summary)

    def save_final_weights(self, summary: TrainSummary, write: Callable[[], Written]) -> Written | None:
        """The final weights, when ``output.save_weights`` is on and the run has trained a step.

        Every rank calls ``write()`` (so every rank must call this), which saves the registered model
        where and how the trainer wants with titanpod.checkpoint's savers: a sharded model is gathered
        one tensor at a time, every rank taking part, and rank 0 streams each into the files, so no
        rank ever holds the whole model and the model stays sharded. Whatever else ``write`` writes
        it must write on rank 0 only. Returns what ``write()`` returns on rank 0; other ranks, and
        runs that save nothing (also a run stopped at once, whose weights may be half-updated), get ``None``.
        A SIGINT or SIGTERM during the save waits for it to complete, and says so; a second one stops at once.
        """
        return self.saves.save_final_weights(summary, write)

    def __enter__(self) -> RunSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.preemption is not None:
            self.preemption.stop()
        try:
            if isinstance(error, Exception):
                self._report_lost_peer(error)
            self.checkpointer.wait()  # a background save in flight is completed, whatever happened
        finally:
            try:
                self.run_writers.close()
                if kind is not None:
                    self.held_dir.remove_if_refused()
            finally:
                self.held_dir.let_go()
        if kind is None and dist.is_initialized():
            dist.barrier()  # no rank tears the group down while another still has collectives in flight
            dist.destroy_process_group()

    def _report_lost_peer(self, error: Exception) -> None:
        """When ``error`` means the job lost a rank, say which and the checkpoint to resume from (once an error)."""
        if error is self._reported_error:
            return
        self._reported_error = error
        info = self.info
        report_lost_peer(error, info.rank, info.world_size, self.saves.newest_checkpoint_anywhere, say_anywhere)
