"""A trainer-state checkpoint folder's layout and its ``trainer.json``: the manifest written, and read back with
its checks (the commit marker, every field, and every file's size and content hash)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch.distributed as dist

from titanpod.checkpoint.checksums import VerifiedHashes, damage, manifest_of
from titanpod.checkpoint.errors import CheckpointError, DamagedCheckpointError
from titanpod.checkpoint.locations import Location, as_location, file_sizes, join, read_bytes
from titanpod.checkpoint.step_folders import TRAINER_FILE, any_earlier_checkpoint, check_marker
from titanpod.checkpoint.trainer_file_schema import check_trainer_file

FORMAT_VERSION = 2
"""The ``trainer.json`` format written: 2 records each file's size and content hash, 1 its size alone."""
READABLE_FORMATS = (1, 2)
"""The ``trainer.json`` formats read (format 1 files are checked by size only)."""
STATE_FOLDER = "state"
ORBAX_FOLDER = "orbax"


def trainer_file_bytes(
    step_number: int,
    data_state: dict[str, Any],
    recipe_json: str,
    manifest: Any,
    data_files: Mapping[str, Any] | None = None,
) -> bytes:
    """The ``trainer.json`` of a checkpoint after ``step_number`` steps: the data loader's position, the recipe,
    ``manifest`` (every other file's size and content hash) and, when given, ``data_files``: the fingerprint of the
    data files the run reads (``titanpod.data.fingerprint``), which a resume compares."""
    trainer = {
        "format": FORMAT_VERSION,
        "step": step_number,
        "data": data_state,
        "recipe": json.loads(recipe_json),
        "files": manifest,
    }
    if data_files is not None:
        trainer["data_files"] = dict(data_files)
    return (json.dumps(trainer, indent=2) + "\n").encode()


def gathered_manifest(
    target: Location, hash_files: bool, is_main: bool, group: Callable[[], Any]
) -> dict[str, Any] | None:
    """The size and content hash of every file in ``target``, once all are written (every rank calls this): each
    rank hashes its share (every world-th file), rank 0 gathers them over ``group()`` (and hashes any file a rank
    did not list); other ranks get ``None``. ``hash_files`` off records sizes alone."""
    sizes = file_sizes(target)
    if not dist.is_initialized():
        return manifest_of(target, sizes, hash_files)
    rank, world = dist.get_rank(), dist.get_world_size()
    share = {name: size for number, (name, size) in enumerate(sizes.items()) if number % world == rank}
    process_group = group()
    parts: list[dict[str, Any]] | None = [{} for _ in range(world)] if is_main else None
    dist.gather_object(manifest_of(target, share, hash_files), parts, dst=0, group=process_group)
    if parts is None:
        return None
    found = {name: item for part in parts for name, item in part.items()}
    missing = {name: size for name, size in sizes.items() if name not in found}
    found.update(manifest_of(target, missing, hash_files))
    return {name: found[name] for name in sizes}


def read_on_every_rank(folder: Location, verified: VerifiedHashes) -> dict[str, Any]:
    """``read_trainer_file`` on every rank, each hashing its share of the files (through ``verified``); a damaged
    file found by any rank is raised on all (so none goes on into DCP's collectives alone)."""
    if not dist.is_initialized():
        return read_trainer_file(folder, verified=verified)
    rank, world = dist.get_rank(), dist.get_world_size()
    trainer, problem = None, None
    try:
        trainer = read_trainer_file(folder, share=(rank, world), verified=verified)
    except DamagedCheckpointError as error:
        problem = (error.problem, error.fix)
    except (CheckpointError, OSError) as error:
        problem = (str(error), None)
    group = dist.new_group(backend="gloo")
    found: list[tuple[str, str | None] | None] = [None] * world
    dist.all_gather_object(found, problem, group=group)
    dist.destroy_process_group(group)
    first = next((item for item in found if item), None)
    if first is not None:
        message, fix = first
        raise CheckpointError(message) if fix is None else DamagedCheckpointError(message, fix)
    assert trainer is not None
    return trainer


def read_trainer_record(folder: Location) -> dict[str, Any]:
    """``trainer.json`` of a checkpoint, after checking its commit marker (required at a URL) and every
    field it holds (``titanpod.checkpoint.trainer_file_schema``), but not the files it lists: what to resume from, read
    in moments (``read_trainer_file`` checks the files too)."""
    folder = as_location(folder)
    path = join(folder, TRAINER_FILE)
    try:
        trainer_bytes = read_bytes(path)
        trainer = json.loads(trainer_bytes)
    except (OSError, ValueError, RecursionError) as error:  # ValueError: not JSON, or not UTF-8
        problem = f"{path} is missing or unreadable ({str(error)[:200]}); {folder} is not a usable checkpoint."
        raise DamagedCheckpointError(problem, any_earlier_checkpoint(folder)) from error
    check_marker(folder, trainer_bytes)
    check_trainer_file(trainer, folder, READABLE_FORMATS)
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
    trainer = read_trainer_record(folder)
    rank, world = share
    mine = [name for number, name in enumerate(trainer["files"]) if number % world == rank]
    problem = damage(folder, trainer["files"], file_sizes(folder), mine, verified)
    if problem is not None:
        name, state = problem
        problem = f"The checkpoint {folder} is damaged: {name} {state}."
        raise DamagedCheckpointError(problem, any_earlier_checkpoint(folder))
    return trainer
