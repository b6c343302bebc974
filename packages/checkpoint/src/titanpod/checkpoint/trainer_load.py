"""Loading a trainer-state checkpoint into a model and its step, in place and under any mesh, after checking
its files and that its recipe fits the run's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from titanpod.checkpoint.checksums import VerifiedHashes
from titanpod.checkpoint.dcp_reader import (
    quiet_single_process,
    refuse_unsafe_metadata,
    safe_reader,
    tensor_shapes,
    unsafe_failure,
)
from titanpod.checkpoint.errors import CheckpointError, DamagedCheckpointError, failure_text
from titanpod.checkpoint.locations import Location, as_location, is_dir, join
from titanpod.checkpoint.recipe_changes import check_same_run
from titanpod.checkpoint.recovery import resume_fix
from titanpod.checkpoint.rng_state import RNG_KEY, restore_rng_state, rng_like
from titanpod.checkpoint.step_folders import any_earlier_checkpoint
from titanpod.checkpoint.trainer_file import ORBAX_FOLDER, STATE_FOLDER, read_on_every_rank
from titanpod.checkpoint.trainer_tensors import check_format, trainer_state_dict
from titanpod.graph import TrainStep


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


def load_trainer_state(
    folder: Location,
    model: nn.Module,
    step: TrainStep,
    recipe: dict[str, Any],
    allow_changes: Sequence[str],
    verified: VerifiedHashes,
    say: Callable[[str], None],
    take_data: Callable[[dict[str, Any]], None] | None = None,
    rerun: str = "",
    same_maths: Sequence[str] = (),
) -> ResumePoint:
    """Load the checkpoint in ``folder`` into ``model`` and ``step`` in place (any mesh; every rank calls this),
    after checking its files (hashes reused from ``verified``), that its recipe differs from ``recipe`` only
    in harmless fields, ``same_maths`` and ``allow_changes`` (those are said; ``check_same_run``), and, with
    ``take_data``, that the data takes its position back (a ``DamagedCheckpointError`` there refuses it before any
    tensor loads).

    A damaged checkpoint is refused with a ``DamagedCheckpointError`` that names the newest earlier one passing its
    checks and the flags that resume from it, ``rerun`` (the flags naming this run again) among them (rank 0 looks
    for it; other ranks say to resume from an earlier one)."""
    folder = as_location(folder)
    try:
        return _load(folder, model, step, recipe, allow_changes, verified, say, take_data, same_maths)
    except DamagedCheckpointError as error:
        if dist.is_initialized() and dist.get_rank() != 0:
            raise
        raise DamagedCheckpointError(error.problem, resume_fix(folder, rerun, verified)) from error


def _load(
    folder: Location,
    model: nn.Module,
    step: TrainStep,
    recipe: dict[str, Any],
    allow_changes: Sequence[str],
    verified: VerifiedHashes,
    say: Callable[[str], None],
    take_data: Callable[[dict[str, Any]], None] | None,
    same_maths: Sequence[str],
) -> ResumePoint:
    trainer = read_on_every_rank(folder, verified)
    for change in check_same_run(trainer["recipe"], recipe, folder, allow_changes, same_maths):
        say(f"resuming with a changed recipe field (allowed by --checkpoint.allow-changes): {change}")
    if take_data is not None:
        take_data(trainer["data"])  # a position the data cannot reach is refused before the tensors load
    if check_format(step, "torch", "jax") == "jax":
        return _load_orbax(folder, step, trainer)
    if not is_dir(join(folder, STATE_FOLDER)):
        raise CheckpointError(f"{folder} holds no {STATE_FOLDER}/ (torch trainer state); was it saved on the xla lane?")
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
            f"Cannot load the trainer state in {folder}: {failure_text(error)}. {any_earlier_checkpoint(folder)}"
        ) from error
    step.load_state_dict(state["optim"])  # DCP loaded into the step's own tensors; this checks them
    restore_rng_state(state[RNG_KEY], model)
    return ResumePoint(folder, int(trainer["step"]), trainer["data"], trainer["recipe"])


def _load_orbax(folder: Location, step: TrainStep, trainer: dict[str, Any]) -> ResumePoint:
    from titanpod.checkpoint.orbax_state import restore_orbax_state

    if not is_dir(join(folder, ORBAX_FOLDER)):
        raise CheckpointError(
            f"{folder} holds no {ORBAX_FOLDER}/ (the xla lane's state); convert its {STATE_FOLDER}/ with "
            "titanpod.checkpoint.orbax_state.dcp_to_orbax first."
        )
    try:  # Orbax reads JSON, msgpack and tensorstore data: nothing in a checkpoint is unpickled
        restored = restore_orbax_state(join(folder, ORBAX_FOLDER), like=step.state_like())
    except Exception as error:  # Orbax and tensorstore raise many kinds: each is named
        raise CheckpointError(
            f"Cannot load the Orbax state in {join(folder, ORBAX_FOLDER)}: {type(error).__name__}: "
            f"{str(error)[:500].rstrip('.')}. {any_earlier_checkpoint(folder)}"
        ) from error
    step.load_state_dict(restored)
    return ResumePoint(folder, int(trainer["step"]), trainer["data"], trainer["recipe"])
