"""Trainer-state checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is a folder ``<run>/checkpoints/step-NNNNNN/`` holding

- ``state/``: torch.distributed.checkpoint (DCP) files of the tensors: the model's
  parameters, the AdamW moments and step count, and the random state (the CPU's, and the GPU's where the
  model trains on one: ``titanpod.checkpoint.rng_state``). Sharded
  parameters and moments are saved as DTensors, so a checkpoint loads under any mesh.
- ``trainer.json``: the step, the data loader's position, the recipe, and the size and content hash (XXH3-128)
  of every other file (a truncated or altered file is named before anything is read;
  ``titanpod.checkpoint.checksums``). Under torchrun each rank hashes its share of the files, on
  save (rank 0 gathers the manifest) and on load.

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
next time the run starts; pruning (``keep_last``) deletes a folder's marker before the rest.
Saves can run in the background (``async_save``): tensors are copied to host memory, training
goes on, and the checkpoint becomes complete when the write has finished.

Never mix, never lose: ``resume never`` refuses a checkpoints folder that already holds step
folders; resume refuses a checkpoint whose recipe differs in a field that changes the model, the
data stream or the trajectory (``titanpod.checkpoint.recipe_changes``) unless
``checkpoint.allow_changes`` lists it; a step folder without ``trainer.json`` is named and skipped
by resume, and moved aside (not overwritten) by a save of its step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from titanpod.checkpoint.checksums import VerifiedHashes, damage, manifest_of
from titanpod.checkpoint.config import CheckpointConfig
from titanpod.checkpoint.dcp_reader import (
    quiet_single_process,
    refuse_unsafe_metadata,
    safe_reader,
    tensor_shapes,
    unsafe_failure,
)
from titanpod.checkpoint.disk_space import disk_full_named, state_bytes
from titanpod.checkpoint.errors import CheckpointError, failure_text
from titanpod.checkpoint.locations import (
    Location,
    as_location,
    base_name,
    exists,
    file_sizes,
    filesystem,
    is_dir,
    is_file,
    is_url,
    join,
    local_path,
    make_folder,
    parent,
    read_bytes,
    remove_tree,
    write_bytes,
)
from titanpod.checkpoint.recipe_changes import check_same_run
from titanpod.checkpoint.rng_state import RNG_KEY, restore_rng_state, rng_like, rng_state
from titanpod.checkpoint.step_folders import (
    COMMIT_MARKER,
    TRAINER_FILE,
    check_marker,
    complete_checkpoints,
    needs_marker,
    set_aside,
    step_folder_name,
    step_folders,
    unfinished_message,
    unfinished_saves,
    write_marker,
)
from titanpod.checkpoint.trainer_file_schema import check_trainer_file
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

FORMAT_VERSION = 2
"""The ``trainer.json`` format written: 2 records each file's size and content hash, 1 its size alone."""
READABLE_FORMATS = (1, 2)
"""The ``trainer.json`` formats read (format 1 files are checked by size only)."""
STATE_FOLDER = "state"
ORBAX_FOLDER = "orbax"


@dataclass(frozen=True)
class ResumePoint:
    """What a loaded checkpoint says about where to continue."""

    folder: Location
    """The checkpoint folder (a ``Path``, or a URL string)."""
    step: int
    """Optimizer steps already done."""
    data_state: dict[str, Any]
    """The data loader's position (``load_state_dict`` input)."""
    recipe: dict[str, Any]
    """The recipe the checkpoint was written with."""


def trainer_state_dict(model: nn.Module, step: TrainStep) -> dict[str, Any]:
    """The tensors of a trainer's state, as DCP saves and loads them (in place), for a step whose
    ``state_format`` is ``torch``: ``{"model": {name: param}, "optim": step.state_dict(), "rng": {...}}``.

    Parameters are the model's own tensors (DTensors when sharded); the step lays out its AdamW
    moments like their parameters (DTensors over this rank's shards), so both reshard on load.
    """
    _check_format(step, "torch")
    params = {name: param.detach() for name, param in model.named_parameters()}
    return {"model": params, "optim": step.state_dict(), RNG_KEY: rng_state(model)}


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())


class Checkpointer:
    """Saves and loads trainer checkpoints under ``checkpoint.dir`` (default ``<run_dir>/checkpoints``).

    Under torchrun every rank calls ``save`` and ``load`` (they are collectives); rank 0
    alone writes ``trainer.json`` and the commit marker, renames folders and deletes old checkpoints.
    """

    def __init__(self, run_dir: Path, config: CheckpointConfig, recipe_json: str, say: Callable[[str], None]) -> None:
        self.folder: Location = as_location(config.dir) if config.dir else Path(run_dir) / "checkpoints"
        """Where the step folders go: a local ``Path`` or a URL."""
        if is_url(self.folder):
            filesystem(str(self.folder))  # fail now, not at the first save, when the URL cannot be opened
        self.config = config
        self.recipe_json = recipe_json
        self.say = say
        self.is_main = not dist.is_initialized() or dist.get_rank() == 0
        self._pending: tuple[Future[Any], Location, int, dict[str, Any]] | None = None
        self._last_saved_step: int | None = None
        self._async_group = None
        self._hasher: ThreadPoolExecutor | None = None
        self.hash_files = True
        """Record each file's content hash in ``trainer.json`` (off only to measure what hashing costs)."""
        self.verified_hashes = VerifiedHashes()
        """The hashes of checkpoint files this checkpointer has checked, kept while each file is unchanged."""
        self._pending_bytes = 0

    def check_step(self, step: TrainStep) -> None:
        """Refuse now, before training, a step whose state cannot be saved here (an unknown ``state_format``,
        or Orbax state for a URL Orbax cannot open)."""
        if _check_format(step, "torch", "jax") == "jax":
            from titanpod.checkpoint.orbax_state import orbax_location

            orbax_location(join(self.folder, ORBAX_FOLDER))

    def remove_partial(self) -> list[Location]:
        """Delete what saves that never completed left behind (rank 0); returns those folders."""
        removed = []
        if self.is_main:
            for path in unfinished_saves(self.folder):
                remove_tree(path)
                removed.append(path)
                why = f"no {COMMIT_MARKER} marker: a save that did not finish" if needs_marker(self.folder) else None
                self.say(f"removed {path}: an incomplete checkpoint ({why or 'its save was interrupted'})")
        if dist.is_initialized():
            dist.barrier()
        return removed

    def check_fresh_start(self, run_dir: Path) -> None:
        """With ``resume never``: refuse, before anything is written, a checkpoints folder that already holds
        step folders (a fresh run's saves would mix with them, or replace them)."""
        if self.config.resume != "never":
            return
        found = [str(base_name(path)) for path in step_folders(self.folder)]
        if not found:
            return
        names = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        where, elsewhere = (
            (run_dir, "") if self.folder == Path(run_dir) / "checkpoints" else (self.folder, " or --checkpoint.dir")
        )
        raise CheckpointError(
            f"{where} already holds checkpoints ({names}): name a new run (--output.run-name ...{elsewhere}), "
            "resume them (--checkpoint.resume auto) or start over (--output.start-over: they are moved into "
            "previous-<UTC time>/, nothing is deleted)."
        )

    def resume_folder(self) -> Location | None:
        """The checkpoint ``config.resume`` points at: None to start fresh."""
        if self.config.resume == "never":
            return None
        if self.config.resume != "auto":
            folder = as_location(self.config.resume)
            if needs_marker(folder) and not is_file(join(folder, COMMIT_MARKER)):
                raise CheckpointError(
                    f"checkpoint.resume={self.config.resume!r} is not a complete checkpoint: "
                    f"{unfinished_message(folder)}; pass a complete step-NNNNNN folder, 'auto' or 'never'."
                )
            if not is_file(join(folder, TRAINER_FILE)):
                raise CheckpointError(
                    f"checkpoint.resume={self.config.resume!r} is not a complete checkpoint folder "
                    f"(no {TRAINER_FILE}); pass a checkpoints/step-NNNNNN folder, 'auto' or 'never'."
                )
            return folder
        found = complete_checkpoints(self.folder, say=self.say)
        return found[-1][1] if found else None

    def save(self, step_number: int, model: nn.Module, step: TrainStep, data_state: dict[str, Any]) -> None:
        """Write the trainer state after ``step_number`` steps (in the background when ``async_save``).

        A second save of the same step (an interval save that is also the run's last step) does nothing.
        """
        if step_number == self._last_saved_step:
            return
        state_format = _check_format(step, "torch", "jax")
        self._last_saved_step = step_number
        self.wait()  # one save in flight at a time
        final = join(self.folder, step_folder_name(step_number))
        # Locally into a staging folder renamed when complete; at a URL (no rename) straight into the step folder.
        target = final if needs_marker(self.folder) else join(self.folder, f".{step_folder_name(step_number)}.partial")
        if self.is_main:
            if exists(final):  # a folder left by another run, or without trainer.json: kept, never overwritten
                self.say(set_aside(final))
            if exists(target):
                remove_tree(target, first=COMMIT_MARKER)
            make_folder(target)
        if dist.is_initialized():
            dist.barrier()
        if state_format == "jax":
            from titanpod.checkpoint.orbax_state import save_orbax_state

            save_orbax_state(join(target, ORBAX_FOLDER), step.state_dict())
            self._finish(target, step_number, data_state)
            return
        state = trainer_state_dict(model, step)
        writer = _state_writer(join(target, STATE_FOLDER))
        if self.config.async_save:
            if dist.is_initialized() and self._async_group is None:
                self._async_group = dist.new_group(backend="gloo")  # the background write's (and hashing's) collectives
            with quiet_single_process():
                future = dcp.async_save(state, storage_writer=writer, process_group=self._async_group)
            self._pending = (self._hashed_after(future, target), target, step_number, data_state)
            self._pending_bytes = state_bytes(state)
        else:
            with self._disk_full_named(target, state_bytes(state)):
                with quiet_single_process():
                    dcp.save(state, storage_writer=writer)
                self._finish(target, step_number, data_state, self._manifest(target))

    def poll(self) -> None:
        """Finish a background save whose files are written (call between steps)."""
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Wait for a background save and make it visible."""
        if self._pending is None:
            return
        future, target, step_number, data_state = self._pending
        self._pending = None
        with self._disk_full_named(target, self._pending_bytes):
            manifest = future.result()
            self._finish(target, step_number, data_state, manifest if self.is_main else None)

    def _disk_full_named(self, target: Location, needed_bytes: int) -> AbstractContextManager[None]:
        """A full disk while saving into ``target``: its unfinished folder removed (rank 0; earlier checkpoints
        are untouched), then a ``DiskFullError`` naming it and the bytes this process's state needs."""

        def remove_partial() -> None:
            if self.is_main and exists(target):
                remove_tree(target, first=COMMIT_MARKER)

        return disk_full_named(target, needed_bytes, remove_partial, "this process's trainer state")

    def _hashed_after(self, future: Future[Any], target: Location) -> Future[Any]:
        """A future of ``target``'s file manifest (``_manifest``: rank 0 gets it, other ranks ``None``), its files
        hashed in a background thread once ``future`` (the background write) is done, so training goes on."""
        if self._hasher is None:
            self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-hash")

        def written_manifest() -> dict[str, Any] | None:
            future.result()
            return self._manifest(target)

        return self._hasher.submit(written_manifest)

    def _manifest(self, target: Location) -> dict[str, Any] | None:
        """The size and content hash of every file in ``target``, once all are written (every rank calls this): each
        rank hashes its share (every world-th file), rank 0 gathers them (and hashes any file a rank did not
        list); other ranks get ``None``."""
        sizes = file_sizes(target)
        if not dist.is_initialized():
            return manifest_of(target, sizes, self.hash_files)
        rank, world = dist.get_rank(), dist.get_world_size()
        share = {name: size for number, (name, size) in enumerate(sizes.items()) if number % world == rank}
        if self._async_group is None:
            self._async_group = dist.new_group(backend="gloo")
        parts: list[dict[str, Any]] | None = [{} for _ in range(world)] if self.is_main else None
        dist.gather_object(manifest_of(target, share, self.hash_files), parts, dst=0, group=self._async_group)
        if parts is None:
            return None
        found = {name: item for part in parts for name, item in part.items()}
        missing = {name: size for name, size in sizes.items() if name not in found}
        found.update(manifest_of(target, missing, self.hash_files))
        return {name: found[name] for name in sizes}

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
        trainer = {
            "format": FORMAT_VERSION,
            "step": step_number,
            "data": data_state,
            "recipe": json.loads(self.recipe_json),
            "files": manifest,
        }
        trainer_bytes = (json.dumps(trainer, indent=2) + "\n").encode()
        write_bytes(join(target, TRAINER_FILE), trainer_bytes)
        write_marker(target, step_number, trainer_bytes)
        final = join(self.folder, step_folder_name(step_number))
        staging = local_path(target) if not is_url(target) else None
        if staging is not None:  # locally the folder appears whole, on disk, by its rename
            _fsync_tree(staging)
            if exists(final):
                remove_tree(final)
            staging.rename(final)
        self.say(f"saved checkpoint {final}")
        self._prune()

    def _prune(self) -> None:
        if self.config.keep_last == 0:
            return
        for _, path in complete_checkpoints(self.folder)[: -self.config.keep_last]:
            remove_tree(path, first=COMMIT_MARKER)

    def load(self, folder: Location, model: nn.Module, step: TrainStep, recipe: dict[str, Any]) -> ResumePoint:
        """Load a checkpoint into ``model`` and ``step`` in place (any mesh), after checking it fits: its recipe
        may differ from ``recipe`` only in harmless fields and ``checkpoint.allow_changes`` (those are said)."""
        folder = as_location(folder)
        trainer = _read_checked(folder, self.verified_hashes)
        for change in check_same_run(trainer["recipe"], recipe, folder, self.config.allow_changes):
            self.say(f"resuming with a changed recipe field (allowed by --checkpoint.allow-changes): {change}")
        if _check_format(step, "torch", "jax") == "jax":
            return self._load_orbax(folder, step, trainer)
        if not is_dir(join(folder, STATE_FOLDER)):
            raise CheckpointError(
                f"{folder} holds no {STATE_FOLDER}/ (torch trainer state); was it saved on the xla lane?"
            )
        refuse_unsafe_metadata(join(folder, STATE_FOLDER))  # before DCP, which would wrap the refusal
        state = trainer_state_dict(model, step)
        try:
            with quiet_single_process():
                state[RNG_KEY] = rng_like(tensor_shapes(join(folder, STATE_FOLDER)))  # the generators it holds
                dcp.load(state, storage_reader=safe_reader(join(folder, STATE_FOLDER)))
        except (Exception, CheckpointException) as error:  # DCP's own CheckpointException is no Exception
            if (unsafe := unsafe_failure(error)) is not None:
                raise unsafe from error
            raise CheckpointError(
                f"Cannot load the trainer state in {folder}: {failure_text(error)}. Resume from an earlier checkpoint "
                f"(--checkpoint.resume {parent(folder)}/step-NNNNNN) or start a new run (--output.run-name NEW)."
            ) from error
        step.load_state_dict(state["optim"])  # DCP loaded into the step's own tensors; this checks them
        restore_rng_state(state[RNG_KEY], model)
        return ResumePoint(folder, int(trainer["step"]), trainer["data"], trainer["recipe"])

    def _load_orbax(self, folder: Location, step: TrainStep, trainer: dict[str, Any]) -> ResumePoint:
        from titanpod.checkpoint.orbax_state import restore_orbax_state

        if not is_dir(join(folder, ORBAX_FOLDER)):
            raise CheckpointError(
                f"{folder} holds no {ORBAX_FOLDER}/ (the xla lane's state); convert its {STATE_FOLDER}/ with "
                "titanpod.checkpoint.orbax_state.dcp_to_orbax first."
            )
        try:  # Orbax reads JSON, msgpack and tensorstore data: nothing in a checkpoint is unpickled
            restored = restore_orbax_state(join(folder, ORBAX_FOLDER), like=step.state_dict())
        except Exception as error:  # Orbax and tensorstore raise many kinds: each is named
            raise CheckpointError(
                f"Cannot load the Orbax state in {join(folder, ORBAX_FOLDER)}: {type(error).__name__}: "
                f"{str(error)[:500].rstrip('.')}. Resume from an earlier checkpoint (--checkpoint.resume "
                f"{parent(folder)}/step-NNNNNN) or start a new run (--output.run-name NEW)."
            ) from error
        step.load_state_dict(restored)
        return ResumePoint(folder, int(trainer["step"]), trainer["data"], trainer["recipe"])


def _state_writer(folder: Location) -> dcp.FileSystemWriter:
    """The DCP writer of ``folder``: the local one (fsynced files), or fsspec's for a URL (an object is stored
    when its stream closes; fsspec streams have no file descriptor to fsync)."""
    if is_url(folder):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(str(folder), single_file_per_rank=True, sync_files=False)
    return dcp.FileSystemWriter(folder, single_file_per_rank=True, sync_files=True)


def _check_format(step: TrainStep, *saved: str) -> str:
    """``step.state_format``, after checking it is one of ``saved`` (the formats the caller saves)."""
    if step.state_format not in saved:
        raise CheckpointError(
            f"{type(step).__name__} declares state_format={step.state_format!r}; this is saved from steps whose "
            f"state is {' or '.join(repr(name) for name in saved)} (see titanpod.graph.TrainStep.state_format)."
        )
    return step.state_format


def _read_checked(folder: Location, verified: VerifiedHashes) -> dict[str, Any]:
    """``read_trainer_file`` on every rank, each hashing its share of the files (through ``verified``); a damaged
    file found by any rank is raised on all (so none goes on into DCP's collectives alone)."""
    if not dist.is_initialized():
        return read_trainer_file(folder, verified=verified)
    rank, world = dist.get_rank(), dist.get_world_size()
    trainer, problem = None, None
    try:
        trainer = read_trainer_file(folder, share=(rank, world), verified=verified)
    except (CheckpointError, OSError) as error:
        problem = str(error)
    group = dist.new_group(backend="gloo")
    found: list[str | None] = [None] * world
    dist.all_gather_object(found, problem, group=group)
    dist.destroy_process_group(group)
    first = next((message for message in found if message), None)
    if first is not None:
        raise CheckpointError(first)
    assert trainer is not None
    return trainer


def read_trainer_file(
    folder: Location, share: tuple[int, int] = (0, 1), verified: VerifiedHashes | None = None
) -> dict[str, Any]:
    """``trainer.json`` of a checkpoint, after checking its commit marker (required at a URL), every field it holds
    (``titanpod.checkpoint.trainer_file_schema``), and that every file it lists is there, whole, with the content
    hash it records (format 2). ``share=(rank, world)`` hashes only every ``world``-th file from the ``rank``-th
    (sizes are all checked); ``verified`` reuses hashes its owner took of files unchanged since (default: every
    file is read)."""
    folder = as_location(folder)
    path = join(folder, TRAINER_FILE)
    try:
        trainer_bytes = read_bytes(path)
        trainer = json.loads(trainer_bytes)
    except (OSError, ValueError, RecursionError) as error:  # ValueError: not JSON, or not UTF-8
        raise CheckpointError(
            f"{path} is missing or unreadable ({str(error)[:200]}); {folder} is not a usable checkpoint."
        ) from error
    check_marker(folder, trainer_bytes)
    check_trainer_file(trainer, folder, READABLE_FORMATS)
    rank, world = share
    mine = [name for number, name in enumerate(trainer["files"]) if number % world == rank]
    problem = damage(folder, trainer["files"], file_sizes(folder), mine, verified)
    if problem is not None:
        name, state = problem
        raise CheckpointError(
            f"The checkpoint {folder} is damaged: {name} {state}. "
            "Resume from an earlier checkpoint or start a new run (--output.run-name NEW)."
        )
    return trainer
