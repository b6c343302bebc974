"""Trainer-state checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is a folder ``<run>/checkpoints/step-NNNNNN/`` holding

- ``state/``: torch.distributed.checkpoint (DCP) files of the tensors: the model's
  parameters, the AdamW moments and step count, and the random state (the CPU's, and the GPU's where the
  model trains on one: ``titanpod.checkpoint.rng_state``). Sharded
  parameters and moments are saved as DTensors, so a checkpoint loads under any mesh.
- ``trainer.json``: the step, the data loader's position, the recipe, the fingerprint of the data files the run
  reads (``titanpod.data.fingerprint``), and the size and content hash (XXH3-128) of every other file (a
  truncated or altered file is named before anything is read; ``titanpod.checkpoint.checksums``). Under
  torchrun each rank hashes its share of the files, on save (rank 0 gathers the manifest) and on load.

Where the step's state goes is what the step declares (``TrainStep.state_format``): a torch
step's ``state_dict()`` (its optimizer state) goes to ``state/`` beside the model's parameters;
the xla step holds parameters and optimizer state as jax arrays, and its ``state_dict()`` goes to
``orbax/`` (orbax-checkpoint) in the same nested layout instead of ``state/``;
``titanpod.checkpoint.orbax_state`` converts between the two forms. Orbax saves are synchronous.

Checkpoints go to ``<run>/checkpoints`` unless ``checkpoint.dir`` names another place: any local
path or fsspec URL (``--checkpoint.dir gs://bucket/run/checkpoints``; ``gs://`` needs gcsfs,
``pip install titanpod-checkpoint[gcs]``). DCP writes and reads URLs through fsspec, with the
same restricted metadata unpickler as local folders; Orbax opens ``gs://``, ``s3://`` and
``file://`` (see ``titanpod.checkpoint.orbax_state``).

A save is complete when its ``COMMITTED`` marker (the step and the SHA-256 of ``trainer.json``)
is written, last, after every rank's files and ``trainer.json``
(``titanpod.checkpoint.step_folders``). Locally, saving writes into ``.step-NNNNNN.partial/``
and renames it when complete, so a folder named ``step-*`` is always whole; a save killed
midway leaves only a ``.partial`` folder. Object stores have no rename: at a URL the save
writes straight into ``step-NNNNNN/``, and a step folder without its marker is a save that did
not finish: resume ignores it, naming it. Either kind of leftover is removed with a message the
next time the run starts; pruning (``keep_last``) deletes a folder's marker before the rest, counts only
checkpoints that pass their checks (a damaged one is moved aside, never deleted) and never deletes through a
symbolic link.
Saves can run in the background (``async_save``): tensors are copied to host memory, training
goes on, and the checkpoint becomes complete when the write has finished.

Never mix, never lose: ``resume never`` refuses a checkpoints folder that already holds step
folders; resume refuses a checkpoint whose recipe differs in a field that changes the model, the
data stream or the trajectory (``titanpod.checkpoint.recipe_changes``) unless
``checkpoint.allow_changes`` lists it; a step folder without ``trainer.json`` is named and skipped
by resume, and moved aside (not overwritten) by a save of its step.

``Checkpointer`` is what a run saves and resumes through. The folder's layout and ``trainer.json`` are
``titanpod.checkpoint.trainer_file``'s; writing a checkpoint is ``trainer_save``'s (``background_save``'s
for ``async_save``); choosing one to resume is ``resume_choice``'s, and loading it ``trainer_load``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from titanpod.checkpoint import resume_choice
from titanpod.checkpoint.background_save import BackgroundSaves
from titanpod.checkpoint.checksums import VerifiedHashes, manifest_of
from titanpod.checkpoint.config import CheckpointConfig
from titanpod.checkpoint.dcp_reader import quiet_single_process
from titanpod.checkpoint.disk_space import state_bytes
from titanpod.checkpoint.errors import CheckpointError, DamagedCheckpointError
from titanpod.checkpoint.locations import Location, as_location, file_sizes, filesystem, is_url, join, local_path
from titanpod.checkpoint.recipe_changes import check_same_run
from titanpod.checkpoint.step_folders import COMMIT_MARKER, TRAINER_FILE, complete_checkpoints, step_folder_name
from titanpod.checkpoint.trainer_file import (
    ORBAX_FOLDER,
    STATE_FOLDER,
    gathered_manifest,
    read_trainer_file,
    trainer_file_bytes,
)
from titanpod.checkpoint.trainer_load import ResumePoint, load_trainer_state
from titanpod.checkpoint.trainer_save import (
    commit,
    full_disk_named,
    prune,
    save_target,
    state_writer,
    unwritable_named,
)
from titanpod.checkpoint.trainer_tensors import check_format, trainer_state_dict
from titanpod.graph import TrainStep

__all__ = [
    "COMMIT_MARKER",
    "ORBAX_FOLDER",
    "STATE_FOLDER",
    "TRAINER_FILE",
    "CheckpointConfig",
    "CheckpointError",
    "Checkpointer",
    "ResumePoint",
    "check_same_run",
    "complete_checkpoints",
    "read_trainer_file",
    "trainer_state_dict",
]


class Checkpointer:
    """Saves and loads trainer checkpoints under ``checkpoint.dir`` (default ``<run_dir>/checkpoints``).

    Under torchrun every rank calls ``save`` and ``load`` (they are collectives); rank 0
    alone writes ``trainer.json`` and the commit marker, renames folders and deletes old checkpoints.
    """

    def __init__(
        self,
        run_dir: Path,
        config: CheckpointConfig,
        recipe_json: str,
        say: Callable[[str], None],
        data_files: Mapping[str, Any] | None = None,
        rerun: str = "",
    ) -> None:
        """``data_files``: the fingerprint of the run's data files each ``trainer.json`` records; ``rerun``: the
        flags that name this run again on a command line, given with the folder to resume from when a checkpoint
        is refused as damaged."""
        self.folder: Location = as_location(config.dir) if config.dir else Path(run_dir) / "checkpoints"
        """Where the step folders go: a local ``Path`` or a URL."""
        if is_url(self.folder):
            filesystem(str(self.folder))  # fail now, not at the first save, when the URL cannot be opened
        self.config = config
        self.recipe_json = recipe_json
        self.data_files = data_files
        """The fingerprint of the run's data files each ``trainer.json`` records (``None``: none recorded)."""
        self.say = say
        self.is_main = not dist.is_initialized() or dist.get_rank() == 0
        self._background = BackgroundSaves(self._manifest)
        self._last_saved_step: int | None = None
        self._async_group: Any = None
        self.hash_files = True
        """Record each file's content hash in ``trainer.json`` (off only to measure what hashing costs)."""
        self.verified_hashes = VerifiedHashes()
        """The hashes of checkpoint files this checkpointer has checked, kept while each file is unchanged."""
        self._good: set[str] = set()
        """Checkpoints known to pass their checks: the ones this checkpointer saved or loaded, and those it checked
        before keeping them (``keep_last``)."""
        self._said_links: set[str] = set()
        """Step folders that are symbolic links, said once each when pruning leaves them."""
        self.rerun = rerun
        """The flags that name this run again (``--output.run-name NAME``), for the resume command of a refusal."""

    def check_step(self, step: TrainStep) -> None:
        """Refuse now, before training, a step whose state cannot be saved here (an unknown ``state_format``,
        or Orbax state for a URL Orbax cannot open)."""
        if check_format(step, "torch", "jax") == "jax":
            from titanpod.checkpoint.orbax_state import orbax_location

            orbax_location(join(self.folder, ORBAX_FOLDER))

    def remove_partial(self) -> list[Location]:
        """Delete what saves that never completed left behind (rank 0); returns those folders."""
        return resume_choice.remove_partial(self.folder, self.is_main, self.say)

    def check_fresh_start(self, run_dir: Path) -> None:
        """With ``resume never``: refuse, before anything is written, a checkpoints folder that already holds
        step folders (a fresh run's saves would mix with them, or replace them)."""
        resume_choice.check_fresh_start(self.folder, self.config.resume, run_dir)

    def resume_folder(self) -> Location | None:
        """The checkpoint ``config.resume`` points at: None to start fresh."""
        return resume_choice.resume_folder(self.folder, self.config.resume, self.say)

    def save(self, step_number: int, model: nn.Module, step: TrainStep, data_state: dict[str, Any]) -> None:
        """Write the trainer state after ``step_number`` steps (in the background when ``async_save``).

        A second save of the same step (an interval save that is also the run's last step) does nothing. A folder
        no longer writable fails the save with a ``CheckpointFolderUnwritableError`` naming it.
        """
        if step_number == self._last_saved_step:
            return
        state_format = check_format(step, "torch", "jax")
        self._last_saved_step = step_number
        self.wait()  # one save in flight at a time
        target = join(self.folder, f".{step_folder_name(step_number)}.partial")  # until save_target says
        with unwritable_named(self.folder, target, step_number, self.is_main):
            target = save_target(self.folder, step_number, self.is_main, self.say)
            self._write(target, step_number, model, step, data_state, state_format)

    def _write(
        self,
        target: Location,
        step_number: int,
        model: nn.Module,
        step: TrainStep,
        data_state: dict[str, Any],
        state_format: str,
    ) -> None:
        """Write the state into ``target`` and make it a checkpoint (or start that in the background)."""
        if state_format == "jax":
            from titanpod.checkpoint.orbax_state import save_orbax_state

            save_orbax_state(join(target, ORBAX_FOLDER), step.state_dict())
            self._finish(target, step_number, data_state)
            return
        state = trainer_state_dict(model, step)
        writer = state_writer(join(target, STATE_FOLDER))
        if self.config.async_save:
            group = self._gloo_group() if dist.is_initialized() else None
            self._background.start(state, writer, group, target, step_number, data_state)
        else:
            with self._disk_full_named(target, state_bytes(state)):
                with quiet_single_process():
                    dcp.save(state, storage_writer=writer)
                self._finish(target, step_number, data_state, self._manifest(target))

    def poll(self) -> None:
        """Finish a background save whose files are written (call between steps)."""
        if self._background.written():
            self.wait()

    def wait(self) -> None:
        """Wait for a background save and make it visible."""
        pending = self._background.take()
        if pending is None:
            return
        unwritable = unwritable_named(self.folder, pending.target, pending.step_number, self.is_main)
        with unwritable, self._disk_full_named(pending.target, pending.state_bytes):
            manifest = pending.manifest.result()
            self._finish(pending.target, pending.step_number, pending.data_state, manifest if self.is_main else None)

    def load(
        self,
        folder: Location,
        model: nn.Module,
        step: TrainStep,
        recipe: dict[str, Any],
        take_data: Callable[[dict[str, Any]], None] | None = None,
        same_maths: Sequence[str] = (),
    ) -> ResumePoint:
        """Load a checkpoint into ``model`` and ``step`` in place (any mesh), after checking it fits: its recipe
        may differ from ``recipe`` only in harmless fields, ``same_maths`` (the fields the recipe's classes declare
        the same maths: ``titanpod.models.field_checks.same_maths_fields``) and ``checkpoint.allow_changes``
        (those are said), and ``take_data`` (the data taking its position back) accepts its data position, before
        any tensor loads. A damaged one is refused naming the newest earlier checkpoint that passes its checks."""
        point = load_trainer_state(
            folder, model, step, recipe, self.config.allow_changes, self.verified_hashes, self.say, take_data,
            self.rerun, same_maths,
        )  # fmt: skip
        self._good.add(_key(point.folder))
        return point

    def _disk_full_named(self, target: Location, needed_bytes: int) -> AbstractContextManager[None]:
        return full_disk_named(target, needed_bytes, self.is_main)

    def _gloo_group(self) -> Any:
        """The process group of the background write's (and hashing's) collectives, made on first use."""
        if self._async_group is None:
            self._async_group = dist.new_group(backend="gloo")
        return self._async_group

    def _manifest(self, target: Location) -> dict[str, Any] | None:
        return gathered_manifest(target, self.hash_files, self.is_main, self._gloo_group)

    def _finish(
        self, target: Location, step_number: int, data_state: dict[str, Any], manifest: dict[str, Any] | None = None
    ) -> None:
        """Rank 0, once every rank's files are written: ``trainer.json`` (with ``manifest``, the files' sizes and
        hashes, taken here unless given), then the commit marker (last), then locally the rename; then old
        checkpoints are pruned."""
        if not self.is_main:
            return
        if manifest is None:
            manifest = manifest_of(target, file_sizes(target), self.hash_files)
        trainer_bytes = trainer_file_bytes(step_number, data_state, self.recipe_json, manifest, self.data_files)
        commit(self.folder, target, step_number, trainer_bytes, self.say)
        self._good.add(_key(join(self.folder, step_folder_name(step_number))))
        prune(self.folder, self.config.keep_last, self._problem_of, self.say, self._said_links)

    def _problem_of(self, folder: Location) -> str | None:
        """What keeps the checkpoint ``folder`` from passing its checks (``read_trainer_file``: marker, fields,
        every file's size and hash); ``None`` when it passes. Each is read once: one that passes is remembered."""
        if _key(folder) in self._good:
            return None
        try:
            read_trainer_file(folder, verified=self.verified_hashes)
        except DamagedCheckpointError as error:
            return error.problem
        except (CheckpointError, OSError) as error:
            return str(error)
        self._good.add(_key(folder))
        return None


def _key(folder: Location) -> str:
    """One name for a checkpoint folder however it was given (a relative local path made absolute)."""
    local = local_path(folder)
    return str(local.absolute()) if local is not None and not is_url(folder) else str(folder)
