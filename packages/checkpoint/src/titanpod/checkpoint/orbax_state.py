"""Trainer state as Orbax checkpoints, and conversion between Orbax and DCP folders.

The xla lane keeps its state as jax arrays; Orbax writes them from their shards and reads
them back onto any sharding. The tree is the trainer-state layout of the torch lanes'
DCP checkpoints, as nested dicts (so parameter names keep their dots)::

    {"model": {name: array}, "optim": {"step": array, "exp_avg": {name: array}, "exp_avg_sq": {name: array}},
     "rng": {...}}   # "rng" only where the lane has one

``dcp_to_orbax`` and ``orbax_to_dcp`` move that tree between the two formats on the host,
bit for bit (bfloat16 goes through ``ml_dtypes``). Orbax uses ``PyTreeCheckpointer``
(orbax-checkpoint's synchronous checkpointer: a save has finished when it returns).
jax and orbax are imported inside the functions only, so importing titanpod.checkpoint never loads jax.

Orbax reads and writes local folders and the object-store URLs its paths (etils epath) open:
``gs://`` and ``s3://``; a ``file://`` URL is handed to it as the local path it names. Any other
URL (``memory://``, ...) is refused with ``CheckpointError`` naming the forms that work.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from titanpod.checkpoint.dcp_reader import SafeFileSystemReader, quiet_single_process, tensor_shapes
from titanpod.checkpoint.errors import CheckpointError
from titanpod.checkpoint.locations import Location, exists, is_dir, is_file, join, local_path, url_scheme

ORBAX_METADATA_FILE = "_METADATA"
"""The tree-structure file every Orbax PyTree checkpoint folder holds."""
DCP_METADATA_FILE = ".metadata"
"""The metadata file every torch.distributed.checkpoint folder holds."""

ORBAX_URL_SCHEMES = ("gs", "s3")
"""URL schemes Orbax opens itself (through etils epath); ``file://`` goes to it as a local path."""

# Dtypes numpy has no name for: torch dtype -> (its ml_dtypes name, the integer dtype of the same width).
_EXTENSION_DTYPES = {torch.bfloat16: ("bfloat16", torch.int16)}


class NotACheckpointError(FileNotFoundError):
    """A folder that should hold an Orbax or DCP checkpoint is missing or holds something else."""


def save_orbax_state(folder: Location, tree: dict) -> None:
    """Write ``tree`` (nested dicts of jax or numpy arrays) as an Orbax checkpoint in ``folder``; returns when written.

    Sharded jax arrays are written shard by shard. ``folder`` (a local path, or a ``gs://``, ``s3://`` or
    ``file://`` URL) must not exist yet.
    """
    import orbax.checkpoint as ocp

    folder = _new_folder(folder, "an Orbax checkpoint")
    ocp.PyTreeCheckpointer().save(folder, args=ocp.args.PyTreeSave(tree))


def restore_orbax_state(folder: Location, like: dict | None = None) -> dict:
    """Read the Orbax checkpoint in ``folder`` (a local path, or a URL as ``save_orbax_state`` takes) as nested
    dicts of arrays.

    With ``like`` (a tree of the same structure holding jax arrays or ``jax.ShapeDtypeStruct``s with shardings,
    e.g. ``XlaStep.state_like()``), each array is read straight onto the sharding of its counterpart in ``like``;
    without it every array comes back as a host numpy array.
    """
    folder = _checked_folder(folder, ORBAX_METADATA_FILE, "an Orbax checkpoint")
    import jax
    import orbax.checkpoint as ocp

    checkpointer = ocp.PyTreeCheckpointer()
    if like is None:
        saved = checkpointer.metadata(folder).item_metadata.tree
        restore_args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), saved)
        return checkpointer.restore(folder, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    restore_args = ocp.checkpoint_utils.construct_restore_args(like)
    return checkpointer.restore(folder, args=ocp.args.PyTreeRestore(item=like, restore_args=restore_args))


def dcp_to_orbax(dcp_folder: Path, orbax_folder: Path) -> None:
    """Convert the DCP checkpoint in ``dcp_folder`` into an Orbax checkpoint in ``orbax_folder``, bit for bit.

    The whole state is read into host memory at its global shapes (whatever sharding it was
    saved with), keeping DCP's nesting: ``{"model": {"a.b": ...}}`` stays two levels deep.
    """
    _new_folder(orbax_folder, "an Orbax checkpoint")  # before reading the whole state
    state = load_dcp_state(dcp_folder)
    save_orbax_state(orbax_folder, _map_tree(state, _tensor_to_numpy))


def orbax_to_dcp(orbax_folder: Path, dcp_folder: Path) -> None:
    """Convert the Orbax checkpoint in ``orbax_folder`` into a DCP checkpoint in ``dcp_folder``, bit for bit."""
    import torch.distributed.checkpoint as dcp

    dcp_folder = _new_folder(dcp_folder, "a DCP checkpoint")
    state = _map_tree(restore_orbax_state(orbax_folder), _numpy_to_tensor)
    # The tensors are on the host already: per_thread_copy_ahead=0 picks DCP's plain CPU loader. Its
    # default, the device-copy-overlapping loader, fails once torchax has registered its device
    # (the "jax" privateuse1 backend has no streams).
    writer = dcp.FileSystemWriter(dcp_folder, per_thread_copy_ahead=0)
    with quiet_single_process():
        dcp.save(state, storage_writer=writer, no_dist=True)


def load_dcp_state(folder: Path) -> dict:
    """The whole DCP checkpoint in ``folder`` as nested dicts of plain CPU tensors of the global shapes.

    Reads the metadata with ``SafeFileSystemReader`` (no arbitrary unpickling); the nesting is
    the one the state dict was saved with. Only tensors are expected: any other entry is an error.
    """
    import torch.distributed.checkpoint as dcp

    folder = _checked_folder(folder, DCP_METADATA_FILE, "a torch.distributed.checkpoint (DCP) checkpoint")
    metadata = SafeFileSystemReader(folder).read_metadata()
    shapes = tensor_shapes(folder, metadata)
    others = sorted(set(metadata.state_dict_metadata) - set(shapes))
    if others:
        raise ValueError(f"The DCP checkpoint {folder} holds non-tensor entries {others}; only tensors are expected.")
    paths = metadata.planner_data or {}
    state: dict = {}
    for key, (shape, dtype) in shapes.items():
        path = paths.get(key, (key,))
        if not all(isinstance(part, str) for part in path):
            raise ValueError(f"The DCP entry {key} sits in a list ({path}); only nested dicts are expected.")
        node = state
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = torch.empty(shape, dtype=dtype)
    with quiet_single_process():
        dcp.load(state, checkpoint_id=folder, storage_reader=SafeFileSystemReader(folder), no_dist=True)
    return state


def orbax_location(folder: Location) -> Path | str:
    """``folder`` as Orbax takes it: a resolved local path (also for a ``file://`` URL), or a ``gs://`` / ``s3://``
    URL; ``CheckpointError`` for any other URL, which Orbax cannot open."""
    local = local_path(folder)
    if local is not None:
        return Path(local).resolve()
    if url_scheme(folder) in ORBAX_URL_SCHEMES:
        return str(folder)
    raise CheckpointError(
        f"Orbax (the xla lane's checkpoints) cannot write to {folder}: it opens local folders, file:// URLs and "
        f"{', '.join(f'{scheme}://' for scheme in ORBAX_URL_SCHEMES)} URLs. Choose one of those for --checkpoint.dir."
    )


def _checked_folder(folder: Location, marker: str, expected: str) -> Path | str:
    """``folder`` as Orbax takes it, after checking it exists and holds ``marker`` (else ``NotACheckpointError``)."""
    folder = orbax_location(folder)
    if not is_dir(folder):
        raise NotACheckpointError(f"{folder} does not exist (or is not a folder); expected {expected} there.")
    if not is_file(join(folder, marker)):
        raise NotACheckpointError(f"{folder} is not {expected}: it has no {marker} file.")
    return folder


def _new_folder(folder: Location, what: str) -> Path | str:
    """``folder`` as Orbax takes it, after checking nothing is there yet (``what`` is written to a new folder)."""
    folder = orbax_location(folder)
    if exists(folder):
        raise FileExistsError(f"{folder} already exists; {what} is written to a new folder.")
    return folder


def _map_tree(tree: dict, function: Callable[[Any], Any]) -> dict:
    """``tree`` (nested dicts) with ``function`` applied to every leaf."""
    return {
        key: _map_tree(value, function) if isinstance(value, dict) else function(value) for key, value in tree.items()
    }


def _tensor_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array with the same bits (bfloat16 as ``ml_dtypes.bfloat16``)."""
    if tensor.dtype in _EXTENSION_DTYPES:
        import ml_dtypes

        name, same_width = _EXTENSION_DTYPES[tensor.dtype]
        return tensor.view(same_width).numpy().view(getattr(ml_dtypes, name))
    return tensor.numpy()


def _numpy_to_tensor(array: Any) -> torch.Tensor:
    """A numpy array as a CPU tensor with the same bits (the inverse of ``_tensor_to_numpy``)."""
    array = np.asarray(array)  # a numpy scalar becomes a 0-d array
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = np.array(array, order="C")  # a writable, contiguous copy (ascontiguousarray would make 0-d arrays 1-d)
    for dtype, (name, _) in _EXTENSION_DTYPES.items():
        if array.dtype.name == name:
            return torch.from_numpy(array.view(np.dtype(f"int{array.dtype.itemsize * 8}"))).view(dtype)
    return torch.from_numpy(array)
