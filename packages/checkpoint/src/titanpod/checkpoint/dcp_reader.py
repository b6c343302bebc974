"""Reading torch.distributed.checkpoint folders without unpickling arbitrary objects.

DCP stores its ``.metadata`` file as a pickle. ``SafeFileSystemReader`` (local folders) and
``SafeFsspecReader`` (fsspec URLs: ``gs://``, ``memory://``, ``file://``) read it with an
unpickler that accepts only the classes DCP metadata is made of (DCP's own dataclasses,
``torch.Size``, dtypes, plain containers), so a crafted file cannot run code on load;
``safe_reader`` picks the one a location needs.

DCP also stores any non-tensor value of a state dict as a pickle (a ``BytesStorageMetadata`` entry),
which its loader unpickles with no restriction. titanpod saves tensors only, so these readers refuse
a checkpoint that declares such an entry (``UnsafeCheckpointError`` naming the key and the file) and
never read one; they refuse data files outside the checkpoint's folder too. Tensor data is read with
``torch.load(weights_only=True)``, as DCP always does.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import PurePosixPath
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner

from titanpod.checkpoint.errors import CheckpointError
from titanpod.checkpoint.locations import Location, filesystem, is_url

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_DCP_FILESYSTEM = "torch.distributed.checkpoint.filesystem"
_DTYPE_NAMES = frozenset(
    {
        "float64", "float32", "float16", "bfloat16", "complex128", "complex64",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
        "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool",
    }
)  # fmt: skip
"""The dtypes a DCP checkpoint may record: a ``torch.dtype`` pickles as the global ``torch.<name>``."""

ALLOWED_GLOBALS = frozenset(
    {
        (_DCP_METADATA, "Metadata"),
        (_DCP_METADATA, "TensorStorageMetadata"),
        (_DCP_METADATA, "ChunkStorageMetadata"),
        (_DCP_METADATA, "BytesStorageMetadata"),
        (_DCP_METADATA, "TensorProperties"),
        (_DCP_METADATA, "MetadataIndex"),
        (_DCP_METADATA, "StorageMeta"),
        (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),  # how TensorProperties pickles its memory format (an Enum)
        (_DCP_FILESYSTEM, "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # layouts pickle by name: _get_layout("torch.strided"), a dict lookup
        ("collections", "OrderedDict"),
        ("pathlib", "PosixPath"),  # the checkpoint id a local save records
        *(("torch", name) for name in _DTYPE_NAMES),
    }
)
"""Every ``(module, name)`` a DCP ``.metadata`` pickle may name (torch 2.13, checked with ``pickletools`` on sync
and async saves). Exact pairs only: no module prefix, no dotted name, no ``builtins`` callable."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint asks for something that could run code on load: a class its metadata never holds, or an
    entry stored as a pickled object."""


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only ``ALLOWED_GLOBALS``; anything else raises before it is imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        """The object ``module.name`` when that exact pair is allowed; ``UnsafeCheckpointError`` otherwise."""
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"The checkpoint metadata refers to {module}.{name}, which DCP metadata never contains; "
            "it was not written by torch.distributed.checkpoint (or was tampered with), so it is not loaded. "
            "Use a checkpoint saved by titanpod, or resume from an earlier one."
        )

    def persistent_load(self, pid: Any) -> Any:
        """DCP metadata has no persistent ids: refuse them."""
        raise UnsafeCheckpointError(f"The checkpoint metadata holds a persistent id ({pid!r}); DCP never writes one.")


def load_metadata_bytes(data: bytes) -> Metadata:
    """Unpickle DCP metadata with the allow-list above (``UnsafeCheckpointError`` for anything else)."""
    metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"The checkpoint metadata holds a {type(metadata).__name__}, not DCP Metadata.")
    return metadata


class _SafeMetadata(FileSystemReader):
    """The restricted metadata read, shared by the local and the fsspec reader (both ``FileSystemReader``s
    that differ only in the filesystem behind ``self.fs``)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's DCP metadata, built only from allowed classes; ``UnsafeCheckpointError`` when it
        declares an entry stored as a pickled object or a data file outside the folder."""
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as handle:
            metadata = load_metadata_bytes(handle.read())
        refuse_pickled_entries(metadata, str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """DCP's read of ``plan``, refusing first any item stored as a pickled object (never read, never unpickled);
        tensor data that torch's weights-only loader refuses is named as such."""
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                stored = (self.storage_data or {}).get(item.storage_index)
                raise UnsafeCheckpointError(
                    _pickled_entry_message(str(self.path), item.storage_index.fqn, getattr(stored, "relative_path", ""))
                )
        try:
            return super().read_data(plan, planner)
        except pickle.UnpicklingError as error:
            raise UnsafeCheckpointError(
                f"{self.path} holds tensor data that is not a plain tensor: torch's weights-only loader refused it "
                "without running anything (a crafted or damaged checkpoint). Resume from a checkpoint titanpod saved."
            ) from error


def refuse_pickled_entries(metadata: Metadata, where: str) -> None:
    """``UnsafeCheckpointError`` when ``metadata`` (read from ``where``) declares an entry stored as a pickled
    object, or keeps data in a file outside its folder (an absolute path or one with ``..``)."""
    for name in ("state_dict_metadata", "storage_data"):
        if not isinstance(getattr(metadata, name) or {}, dict):
            raise UnsafeCheckpointError(
                f"{where} holds a {type(getattr(metadata, name)).__name__} as its {name}, not the mapping DCP writes "
                "(a crafted or damaged checkpoint), so it is not loaded. Resume from a checkpoint titanpod saved."
            )
    files: dict[Any, str] = {}
    for index, stored in (metadata.storage_data or {}).items():
        key, relative = getattr(index, "fqn", index), getattr(stored, "relative_path", None)
        if not _inside_folder(relative):
            raise UnsafeCheckpointError(
                f"{where} keeps {key!r} in {relative!r}, outside the checkpoint's folder; DCP writes its data files "
                "inside it, so this checkpoint was crafted or damaged and is not loaded. Resume from a checkpoint "
                "titanpod saved."
            )
        files.setdefault(key, relative)
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            raise UnsafeCheckpointError(_pickled_entry_message(where, key, files.get(key, "")))


def _inside_folder(relative: Any) -> bool:
    """Whether ``relative`` is a path inside the folder it is relative to (no absolute path, no ``..``)."""
    if not isinstance(relative, str) or not relative:
        return False
    path = PurePosixPath(relative)
    return not path.is_absolute() and ".." not in path.parts


def _pickled_entry_message(where: str, key: str, file: str) -> str:
    stored = f"its bytes in {file}" if file else "no data file recorded"
    return (
        f"{where} declares {key!r} as a pickled Python object (BytesStorageMetadata, {stored}); loading it would "
        "unpickle bytes from the checkpoint, which can run any code. titanpod saves only tensors in DCP state, so "
        "this checkpoint was not written by titanpod (or was tampered with) and is not loaded: resume from a "
        "checkpoint titanpod saved."
    )


def refuse_unsafe_metadata(folder: Location) -> None:
    """Read the DCP metadata of ``folder`` before loading it, so that anything unsafe in it raises
    ``UnsafeCheckpointError`` itself: DCP's loader would fold that refusal into an ``AssertionError`` (and then
    try rank-local metadata files, read with the same restrictions). Metadata missing or unreadable for another
    reason is left for the load to report."""
    try:
        safe_reader(folder).read_metadata()
    except UnsafeCheckpointError:
        raise
    except Exception:  # the load that follows reports it, in its own words
        return


def unsafe_failure(error: BaseException) -> UnsafeCheckpointError | None:
    """The ``UnsafeCheckpointError`` behind a failed DCP load (``error`` itself, or one rank's failure that DCP's
    ``CheckpointException`` gathers), to raise as it is; ``None`` when the load failed for another reason."""
    if isinstance(error, UnsafeCheckpointError):
        return error
    failures = getattr(error, "failures", None) or {}
    return next((found for found, _ in failures.values() if isinstance(found, UnsafeCheckpointError)), None)


class SafeFileSystemReader(_SafeMetadata):
    """``FileSystemReader`` (a local folder) whose metadata is read with the restricted unpickler."""


class SafeFsspecReader(_SafeMetadata, FsspecReader):
    """``FsspecReader`` (an fsspec URL) whose metadata is read with the restricted unpickler."""


def safe_reader(folder: Location) -> FileSystemReader:
    """The safe DCP reader of ``folder``: ``SafeFsspecReader`` for a URL, ``SafeFileSystemReader`` for a local path."""
    if is_url(folder):
        filesystem(str(folder))  # a clear error when the URL's filesystem is not installed
        return SafeFsspecReader(str(folder))
    return SafeFileSystemReader(folder)


def tensor_shapes(folder: Any, metadata: Metadata | None = None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every tensor a DCP folder holds: flattened key -> (global shape, dtype), from its metadata
    (read from ``folder`` unless already read and passed as ``metadata``)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = metadata or safe_reader(folder).read_metadata()
    return {
        key: (tuple(entry.size), entry.properties.dtype)
        for key, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, TensorStorageMetadata)
    }


@contextlib.contextmanager
def quiet_single_process() -> Iterator[None]:
    """Silence DCP's warning that it runs without torch.distributed: in one process that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield
