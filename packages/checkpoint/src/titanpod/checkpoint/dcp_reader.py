"""Reading torch.distributed.checkpoint folders without unpickling arbitrary objects.

DCP stores its ``.metadata`` file as a pickle. ``SafeFileSystemReader`` (local folders) and
``SafeFsspecReader`` (fsspec URLs: ``gs://``, ``memory://``, ``file://``) read it with an
unpickler that accepts only the classes DCP metadata is made of (DCP's own dataclasses,
``torch.Size``, dtypes, plain containers), so a crafted file cannot run code on load;
``safe_reader`` picks the one a location needs. Tensor data is read as raw bytes, as DCP always does.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

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


class UnsafeCheckpointError(ValueError):
    """A checkpoint's metadata asks to build an object that checkpoint metadata never holds."""


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
        """The checkpoint's DCP metadata, built only from allowed classes."""
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as handle:
            metadata = load_metadata_bytes(handle.read())
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


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
