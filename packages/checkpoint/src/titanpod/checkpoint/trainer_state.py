"""Trainer-state checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is a folder ``<run>/checkpoints/step-NNNNNN/`` holding

- ``state/``: torch.distributed.checkpoint (DCP) files of the tensors: the model's
  parameters, the AdamW moments and step count, and PyTorch's CPU random state. Sharded
  parameters and moments are saved as DTensors, so a checkpoint loads under any mesh.
- ``trainer.json``: the step, the data loader's position, the recipe, and the size of
  every file (a truncated file is caught before anything is read).

Where the step's state goes is what the step declares (``TrainStep.state_format``): a torch
step's ``state_dict()`` (its optimizer state) goes to ``state/`` beside the model's parameters;
the xla step holds parameters and optimizer state as jax arrays, and its ``state_dict()`` goes to
``orbax/`` (orbax-checkpoint) in the same nested layout instead of ``state/``;
``titanpod.checkpoint.orbax_state`` converts between the two forms. Orbax saves are synchronous.

Saving writes into ``.step-NNNNNN.partial/`` and renames it when complete, so a folder
named ``step-*`` is always whole; a save killed midway leaves only a ``.partial`` folder,
removed with a message the next time the run starts. Saves can run in the background
(``async_save``): tensors are copied to host memory, training goes on, and the folder
appears when the write has finished.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from titanpod.checkpoint.dcp_reader import SafeFileSystemReader, quiet_single_process
from titanpod.graph import TrainStep

FORMAT_VERSION = 1
STATE_FOLDER = "state"
ORBAX_FOLDER = "orbax"
TRAINER_FILE = "trainer.json"
_STEP_FOLDER = re.compile(r"^step-(\d{6,})$")


class CheckpointError(ValueError):
    """A trainer checkpoint cannot be used: what is wrong with it, and what to do."""


@dataclass(frozen=True)
class CheckpointConfig:
    """When trainer-state checkpoints are written and whether a run resumes from one."""

    every: int = 0
    """Save the trainer state every this many steps (0: only at the end, if ``at_end``)."""
    at_end: bool = True
    """Save the trainer state after the last step (and when the run is interrupted)."""
    keep_last: int = 2
    """Complete checkpoints to keep; older ones are deleted once a newer one is complete (0 keeps all)."""
    async_save: bool = False
    """Write in the background: training goes on while the files are written."""
    resume: str = "auto"
    """``auto``: continue from the newest complete checkpoint in the run directory, if any;
    ``never``: start fresh (existing checkpoints are left alone); or the path of a checkpoint folder."""
    export_hf: bool = False
    """After the last step, also export the model as Hugging Face sharded safetensors to ``<run>/hf``."""

    def __post_init__(self) -> None:
        if self.every < 0 or self.keep_last < 0:
            raise ValueError("checkpoint.every and checkpoint.keep_last must be 0 or more.")


@dataclass(frozen=True)
class ResumePoint:
    """What a loaded checkpoint says about where to continue."""

    folder: Path
    """The checkpoint folder."""
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
    return {"model": params, "optim": step.state_dict(), "rng": {"torch_cpu": torch.get_rng_state()}}


def complete_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints in ``folder`` (``step-NNNNNN`` with a trainer file), oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _STEP_FOLDER.match(path.name)
        if match and (path / TRAINER_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def _manifest(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.stat().st_size for path in sorted(folder.rglob("*")) if path.is_file()}


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())


class Checkpointer:
    """Saves and loads trainer checkpoints under ``<run_dir>/checkpoints``.

    Under torchrun every rank calls ``save`` and ``load`` (they are collectives); rank 0
    alone writes ``trainer.json``, renames folders and deletes old checkpoints.
    """

    def __init__(self, run_dir: Path, config: CheckpointConfig, recipe_json: str, say: Callable[[str], None]) -> None:
        self.folder = Path(run_dir) / "checkpoints"
        self.config = config
        self.recipe_json = recipe_json
        self.say = say
        self.is_main = not dist.is_initialized() or dist.get_rank() == 0
        self._pending: tuple[Future[Any], Path, int, dict[str, Any]] | None = None
        self._last_saved_step: int | None = None
        self._async_group = None

    def remove_partial(self) -> list[Path]:
        """Delete folders left by saves that never completed (rank 0); returns them."""
        removed = []
        if self.is_main and self.folder.is_dir():
            for path in sorted(self.folder.glob(".step-*.partial")):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
                self.say(f"removed {path}: an incomplete checkpoint (its save was interrupted)")
        if dist.is_initialized():
            dist.barrier()
        return removed

    def resume_folder(self) -> Path | None:
        """The checkpoint ``config.resume`` points at: None to start fresh."""
        if self.config.resume == "never":
            return None
        if self.config.resume != "auto":
            folder = Path(self.config.resume)
            if not (folder / TRAINER_FILE).is_file():
                raise CheckpointError(
                    f"checkpoint.resume={self.config.resume!r} is not a complete checkpoint folder "
                    f"(no {TRAINER_FILE}); pass a checkpoints/step-NNNNNN folder, 'auto' or 'never'."
                )
            return folder
        found = complete_checkpoints(self.folder)
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
        final = self.folder / f"step-{step_number:06d}"
        staging = self.folder / f".{final.name}.partial"
        if self.is_main:
            if staging.exists():
                shutil.rmtree(staging)
            staging.mkdir(parents=True)
        if dist.is_initialized():
            dist.barrier()
        if state_format == "jax":
            from titanpod.checkpoint.orbax_state import save_orbax_state

            save_orbax_state(staging / ORBAX_FOLDER, step.state_dict())
            self._finish(staging, step_number, data_state)
            return
        state = trainer_state_dict(model, step)
        writer = dcp.FileSystemWriter(staging / STATE_FOLDER, single_file_per_rank=True, sync_files=True)
        if self.config.async_save:
            if dist.is_initialized() and self._async_group is None:
                self._async_group = dist.new_group(backend="gloo")  # the background write's own collectives
            with quiet_single_process():
                future = dcp.async_save(state, storage_writer=writer, process_group=self._async_group)
            self._pending = (future, staging, step_number, data_state)
        else:
            with quiet_single_process():
                dcp.save(state, storage_writer=writer)
            self._finish(staging, step_number, data_state)

    def poll(self) -> None:
        """Finish a background save whose files are written (call between steps)."""
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Wait for a background save and make it visible."""
        if self._pending is None:
            return
        future, staging, step_number, data_state = self._pending
        self._pending = None
        future.result()
        self._finish(staging, step_number, data_state)

    def _finish(self, staging: Path, step_number: int, data_state: dict[str, Any]) -> None:
        if self.is_main:
            trainer = {
                "format": FORMAT_VERSION,
                "step": step_number,
                "data": data_state,
                "recipe": json.loads(self.recipe_json),
                "files": _manifest(staging),
            }
            (staging / TRAINER_FILE).write_text(json.dumps(trainer, indent=2) + "\n", encoding="utf-8")
            _fsync_tree(staging)
            final = self.folder / staging.name.removeprefix(".").removesuffix(".partial")
            if final.exists():
                shutil.rmtree(final)
            staging.rename(final)
            self.say(f"saved checkpoint {final}")
            self._prune()

    def _prune(self) -> None:
        if self.config.keep_last == 0:
            return
        for _, path in complete_checkpoints(self.folder)[: -self.config.keep_last]:
            shutil.rmtree(path, ignore_errors=True)

    def load(self, folder: Path, model: nn.Module, step: TrainStep, recipe: dict[str, Any]) -> ResumePoint:
        """Load a checkpoint into ``model`` and ``step`` in place (any mesh), after checking it fits."""
        trainer = read_trainer_file(folder)
        check_same_run(trainer["recipe"], recipe, folder)
        if _check_format(step, "torch", "jax") == "jax":
            return self._load_orbax(folder, step, trainer)
        if not (folder / STATE_FOLDER).is_dir():
            raise CheckpointError(
                f"{folder} holds no {STATE_FOLDER}/ (torch trainer state); was it saved on the xla lane?"
            )
        state = trainer_state_dict(model, step)
        try:
            with quiet_single_process():
                dcp.load(state, storage_reader=SafeFileSystemReader(folder / STATE_FOLDER))
        except Exception as error:  # DCP reports missing keys, bad shapes and unreadable data in many types
            raise CheckpointError(
                f"Cannot load the trainer state in {folder}: {error}. Resume from an earlier checkpoint "
                f"(--checkpoint.resume {folder.parent}/step-NNNNNN) or start fresh (--checkpoint.resume never)."
            ) from error
        step.load_state_dict(state["optim"])  # DCP loaded into the step's own tensors; this checks them
        torch.set_rng_state(state["rng"]["torch_cpu"])
        return ResumePoint(folder, int(trainer["step"]), trainer["data"], trainer["recipe"])

    def _load_orbax(self, folder: Path, step: TrainStep, trainer: dict[str, Any]) -> ResumePoint:
        from titanpod.checkpoint.orbax_state import restore_orbax_state

        if not (folder / ORBAX_FOLDER).is_dir():
            raise CheckpointError(
                f"{folder} holds no {ORBAX_FOLDER}/ (the xla lane's state); convert its {STATE_FOLDER}/ with "
                "titanpod.checkpoint.orbax_state.dcp_to_orbax first."
            )
        step.load_state_dict(restore_orbax_state(folder / ORBAX_FOLDER, like=step.state_dict()))
        return ResumePoint(folder, int(trainer["step"]), trainer["data"], trainer["recipe"])


def _check_format(step: TrainStep, *saved: str) -> str:
    """``step.state_format``, after checking it is one of ``saved`` (the formats the caller saves)."""
    if step.state_format not in saved:
        raise CheckpointError(
            f"{type(step).__name__} declares state_format={step.state_format!r}; this is saved from steps whose "
            f"state is {' or '.join(repr(name) for name in saved)} (see titanpod.graph.TrainStep.state_format)."
        )
    return step.state_format


def read_trainer_file(folder: Path) -> dict[str, Any]:
    """``trainer.json`` of a checkpoint, after checking that every file it lists is there, whole."""
    path = Path(folder) / TRAINER_FILE
    try:
        trainer = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(
            f"{path} is missing or unreadable ({error}); {folder} is not a usable checkpoint."
        ) from error
    if trainer.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has format {trainer.get('format')!r}; this version reads {FORMAT_VERSION}.")
    for name, size in trainer["files"].items():
        file = Path(folder) / name
        found = file.stat().st_size if file.is_file() else None
        if found != size:
            state = "missing" if found is None else f"{found:,} bytes instead of {size:,}"
            raise CheckpointError(
                f"The checkpoint {folder} is damaged: {name} is {state} (truncated or overwritten). "
                "Resume from an earlier checkpoint or start fresh (--checkpoint.resume never)."
            )
    return trainer


def check_same_run(saved: dict[str, Any], current: dict[str, Any], folder: Path) -> None:
    """Refuse a checkpoint of another model or recipe, naming the fields that differ."""
    differences = []
    for section, keys in (("", ("name",)), ("model", ("family", "flavor"))):
        for key in keys:
            old = saved.get(section, {}).get(key) if section else saved.get(key)
            new = current.get(section, {}).get(key) if section else current.get(key)
            if old != new:
                differences.append(f"{section + '.' if section else ''}{key}: checkpoint {old!r}, this run {new!r}")
    if differences:
        raise CheckpointError(
            f"The checkpoint {folder} is from a different run ({'; '.join(differences)}). "
            "Point --checkpoint.resume at a checkpoint of this recipe, or use --checkpoint.resume never."
        )
