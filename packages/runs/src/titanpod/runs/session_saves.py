"""A session's saves: the trainer-state checkpoints, resuming from one, and the final weights.

Checkpoints whose save never completed are removed when the session opens; ``resume`` registers what the
checkpoints hold and continues from the one ``checkpoint.resume`` names, once the disks have room for the saves.
A save comes every ``checkpoint.every`` steps and at the end, and a background save in flight is completed
whatever happened. The final weights are written by the trainer (a sharded model gathered one tensor at a time
and streamed into its files by rank 0). SIGINT (Ctrl-C) and SIGTERM are handled by ``titanpod.graph.train``: the
step in flight finishes and the summary comes back marked ``interrupted``; the checkpoint is then saved, and the
session says so. A second signal stops at once, and nothing is saved (``TrainSummary.stopped_at_once``). A signal
that comes during a save waits for it to complete.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from rich.markup import escape
from torch import nn

from titanpod.checkpoint import Checkpointer, complete_checkpoints
from titanpod.checkpoint.disk_space import state_bytes
from titanpod.checkpoint.errors import CheckpointFolderUnwritableError, DamagedCheckpointError
from titanpod.checkpoint.locations import Location, join
from titanpod.checkpoint.step_folders import TRAINER_FILE, any_earlier_checkpoint
from titanpod.data.positions import DataPositionError
from titanpod.device import ProcessInfo
from titanpod.graph import TrainStep, TrainSummary
from titanpod.graph.interrupt import exit_status, signal_name, stop_after_step
from titanpod.models.field_checks import same_maths_fields
from titanpod.recipes.recipe import RunRecipe
from titanpod.runs.every_rank import first_on_any_rank, raise_on_every_rank
from titanpod.runs.space_check import NotEnoughSpaceError, check_space, save_needs
from titanpod.runs.stop_notice import weights_left_out

Written = TypeVar("Written")
"""What a trainer's final-weights writer returns (a path, a folder)."""


class ResumableData(Protocol):
    """What the session needs of a trainer's data: its position, to save and to restore."""

    def state_dict(self) -> dict[str, Any]:
        """The data position (what ``load_state_dict`` takes back)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by ``state_dict``."""
        ...


def position_taker(data: ResumableData, folder: Location) -> Callable[[dict[str, Any]], None]:
    """What hands the checkpoint ``folder``'s data position to ``data`` (every rank): a position its data cannot
    reach (``DataPositionError``: on any rank) refuses the checkpoint on every rank as damaged, naming the field,
    the value and the file."""

    def take(state: dict[str, Any]) -> None:
        problem = None
        try:
            data.load_state_dict(state)
        except DataPositionError as error:
            problem = f"{join(folder, TRAINER_FILE)}: data.{error}. The file was altered or damaged after the save."
        found = first_on_any_rank(problem)
        if found is not None:
            raise DamagedCheckpointError(found, any_earlier_checkpoint(folder))

    return take


class RunSaves:
    """What a run saves and resumes from: the model and step it registered, their checkpoints, its final weights."""

    def __init__(
        self,
        recipe: RunRecipe,
        checkpointer: Checkpointer,
        run_dir: Path,
        info: ProcessInfo,
        say: Callable[[str], None],
        report_error: Callable[[Exception], None] = lambda error: None,
        agree: Callable[[int], int] = lambda value: value,
    ) -> None:
        """Nothing registered yet: ``resume`` registers the model, the step and the data position.

        ``report_error`` is called with an error a save raises, while the save's hold on SIGINT and SIGTERM is
        still on (``saving_through_a_signal``): a save's collective fails when another rank is lost, and
        torchrun's agent stops the survivors with SIGTERM moments later, which must not cut the report short.
        ``agree`` gives the largest value any process of the job offers (``StopAgreement.largest``)."""
        self.recipe = recipe
        self.checkpointer = checkpointer
        self.run_dir = run_dir
        self.info = info
        self.say = say
        self.report_error = report_error
        self.agree = agree
        self.stop_save_seconds = 0.0
        """How long the checkpoint after a stop signal took to complete (0 before one)."""
        self.start_step = 0
        """Steps done before this run started (set by ``resume``)."""
        self.model: nn.Module | None = None
        """The trained module whose parameters the checkpoints hold (set by ``resume``)."""
        self.step: TrainStep | None = None
        """The training step whose optimizer state the checkpoints hold (set by ``resume``)."""
        self.data_state: Callable[[], dict[str, Any]] = dict
        """Returns the data position to save (set by ``resume``)."""
        self.unwritable: str | None = None
        """Why the checkpoint folder took no more saves (it stopped being writable); ``None`` while it takes them."""
        self._unwritable_here: str | None = None
        """This process's own finding of that, not yet agreed with the others."""

    def resume(
        self,
        model: nn.Module,
        step: TrainStep,
        data: ResumableData,
        data_state: Callable[[], dict[str, Any]] | None = None,
    ) -> Location | None:
        """Register ``model``, ``step`` and the data position (as ``RunSession.resume`` says), refuse the run when a
        disk lacks room for its saves, and load the checkpoint ``checkpoint.resume`` names, setting ``start_step``.
        Returns the folder resumed from; ``None`` when starting fresh. Every rank must call it."""
        self.model, self.step = model, step
        self.checkpointer.check_step(step)  # a state that cannot be saved where checkpoints go fails now
        self.check_space(model, step)
        self.data_state = data_state if data_state is not None else data.state_dict
        folder = self.checkpointer.resume_folder()
        if folder is None:
            return None
        take_data = position_taker(data, folder)  # before the tensors load: a position out of reach is refused
        same_maths = same_maths_fields(type(self.recipe))
        point = self.checkpointer.load(folder, model, step, self.recipe.to_dict(), take_data, same_maths)
        self.start_step = point.step
        return folder

    def check_space(self, model: nn.Module, step: TrainStep) -> None:
        """Before step 1: refuse the run (on every rank) when a disk it saves to has less room than a checkpoint
        and the final weights need, with a margin (``titanpod.runs.space_check``)."""
        problem = None
        if self.info.is_main:
            saves = self.recipe.checkpoint.every > 0 or self.recipe.checkpoint.at_end
            optimizer = state_bytes(step.state_dict()) if step.state_format == "torch" else 0
            needs = save_needs(
                self.checkpointer.folder, self.run_dir, model, optimizer, checkpoint=saves,
                weights=self.recipe.output.save_weights, ranks=self.info.world_size,
            )  # fmt: skip
            try:
                check_space(needs)
            except NotEnoughSpaceError as error:
                problem = error
        raise_on_every_rank(problem)

    def registered(self) -> tuple[nn.Module, TrainStep]:
        """The model and step ``resume`` registered; raises when it has not been called."""
        if self.model is None or self.step is None:
            raise RuntimeError("RunSession.resume(model, step, data) must be called before training or saving.")
        return self.model, self.step

    def save_checkpoint(self, step_number: int) -> None:
        """Save the trainer state after ``step_number`` steps (every rank; in the background with
        ``checkpoint.async_save``). A second save of the same step does nothing.

        A checkpoint folder that stopped being writable (``CheckpointFolderUnwritableError``, on any rank, here or
        found by ``poll`` since the last save) does not stop the process: it is said, no later save is tried, and
        ``stop_reason`` gives the reason, so the run stops after this step and still writes its final weights."""
        if self.unwritable is not None:
            return
        model, step = self.registered()
        with self._noting_unwritable():
            self.checkpointer.save(step_number, model, step, self.data_state())
        found = first_on_any_rank(self._unwritable_here)
        if found is not None:
            newest = self.newest_checkpoint_anywhere()
            self.unwritable = (
                f"step {step_number}: {found} The run stops after this step and writes its final weights to "
                f"{self.run_dir}; the newest checkpoint is {newest or 'none'}."
            )
            self.say(f"[red]{escape(self.unwritable)}[/]")

    def poll(self) -> None:
        """Finish a background save whose files are written (between steps); a folder found no longer writable is
        noted here and acted on at the next save (``save_checkpoint``), when every rank agrees."""
        with self._noting_unwritable():
            self.checkpointer.poll()

    def stop_reason(self, step_number: int) -> str | None:
        """Why the run stops after ``step_number``: a checkpoint folder that stopped being writable; else ``None``
        (the same on every rank)."""
        return self.unwritable

    @contextmanager
    def _noting_unwritable(self) -> Iterator[None]:
        try:
            yield
        except CheckpointFolderUnwritableError as error:
            self._unwritable_here = str(error)

    def save_at_end(self, summary: TrainSummary) -> None:
        """The at-end checkpoint and, after a signal, the line saying what was saved (as ``RunSession.save_at_end``
        says; every rank calls it)."""
        if summary.stopped_at_once:
            newest = self.newest_checkpoint()
            name = signal_name(summary.stop_signal or signal.SIGINT)
            self.say(
                f"[red]stopped at once by {name} after step {summary.steps_done}[/], the next step cut short: "
                f"saved nothing; newest checkpoint {newest or 'none'}"
            )
            return
        saving = self.recipe.checkpoint.at_end and summary.steps_done > self.start_step
        started = time.monotonic()
        if saving:
            self.save_checkpoint(summary.steps_done)
        if not summary.interrupted:
            return
        self.checkpointer.wait()  # the checkpoint named below is complete
        self.stop_save_seconds = time.monotonic() - started
        newest = self.newest_checkpoint()
        saved = f"saved checkpoint {newest}" if saving else f"checkpoint.at_end is off; newest checkpoint {newest}"
        name = signal_name(summary.stop_signal or signal.SIGINT)
        self.say(f"[yellow]stopped by {name} after step {summary.steps_done}[/]: {saved}")

    def save_final_weights(self, summary: TrainSummary, write: Callable[[], Written]) -> Written | None:
        """Call ``write()`` on every rank, when ``output.save_weights`` is on and the run has trained a step (as
        ``RunSession.save_final_weights`` says). Returns what it returns on rank 0; ``None`` elsewhere."""
        self.registered()
        if not self.recipe.output.save_weights or summary.steps_done == 0 or summary.stopped_at_once:
            return None
        notice = self.recipe.checkpoint.notice_seconds
        if (left_out := weights_left_out(summary, notice, self.stop_save_seconds, self.agree)) is not None:
            self.say(f"[yellow]{left_out}[/]")
            return None
        with self.saving_through_a_signal("the final weights"):
            written = write()
        return written if self.info.is_main else None

    @contextmanager
    def saving_through_a_signal(self, what: str) -> Iterator[None]:
        """Let a save in the block complete when SIGINT or SIGTERM arrives, and say so after (rank 0). A second
        signal stops the save at once (what it wrote so far is removed) and the process with 128 + its number.
        An error the save raises goes to ``report_error`` before the signals are let go, then on."""
        with stop_after_step() as request:
            try:
                yield
            except KeyboardInterrupt:
                name = signal_name(request.signal_at_once())
                newest = self.newest_checkpoint()
                stopped = f"[red]stopped at once by {name} while saving {what}[/]"
                self.say(f"{stopped}: not saved; newest checkpoint {newest}")
                raise SystemExit(exit_status(request.signal_at_once())) from None
            except Exception as error:
                self.report_error(error)  # before the signals are let go (see __init__)
                raise
        if request.signum is not None:
            name = signal_name(request.signum)
            self.say(f"[yellow]{name} came while saving {what}: the save was completed first[/]")

    def newest_checkpoint(self) -> str | None:
        """The newest complete checkpoint folder (rank 0; ``None`` elsewhere and when there is none)."""
        if not self.info.is_main:
            return None
        return self.newest_checkpoint_anywhere()

    def newest_checkpoint_anywhere(self) -> str | None:
        """The newest complete checkpoint folder, read by whichever rank asks (``None`` when there is none)."""
        found = complete_checkpoints(self.checkpointer.folder)
        return str(found[-1][1]) if found else None
