"""Safetensors on disk: one file, or shards listed in a ``*.safetensors.index.json``.

Reading streams: one file is open at a time and one tensor is read at a time (``get_slice``
reads part of one). Before any data is read, ``SafetensorsFiles.check`` holds every tensor's
name and shape against what a model expects, from the headers alone: a missing, unexpected
or mis-shaped tensor is a ``CheckpointMismatchError`` that names it and its file.
Writing groups tensors, in order, into shards of at most a given size, with the index the
way transformers and diffusers write it; each file's header is written first and then one tensor
at a time (``safetensors_stream``), which may be gathered from many processes just before its turn.
Each file is hashed as it is written and ``checksums.json`` records its size and hash; finding a
folder's files checks them against it first (``titanpod.checkpoint.checksums``).
Only safetensors: pickles are never read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from titanpod.checkpoint.checksums import digest_bytes, manifest_entry, verify_weight_files, write_weights_manifest
from titanpod.checkpoint.errors import CheckpointMismatchError
from titanpod.checkpoint.safetensors_stream import StreamedFile, TensorData, TensorEntry, data_order

SAFETENSORS_DTYPES: Mapping[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
}
"""Safetensors dtype code -> torch dtype, for the floating dtypes titanpod loads models in; widest first."""

PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
"""Weights titanpod finds only to refuse them."""

Progress = Callable[[str], None]
"""Called with a line of progress text (e.g. ``print``)."""

_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def parse_size(text: str | int) -> int:
    """Bytes from ``5GB``, ``500MB``, ``2GiB`` or a plain integer (pydantic's ``ByteSize``); ``ValueError``
    otherwise."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(ByteSize).validate_python(text))
    except ValidationError:
        raise ValueError(f"Cannot read the size {text!r}; write it like 5GB, 500MB or 2GiB.") from None


def dtype_from_name(name: str) -> torch.dtype:
    """``torch.float32`` from ``float32`` (also ``bf16``, ``fp16``, ``fp32``): the dtypes checkpoints are written in."""
    key = _DTYPE_ALIASES.get(name, name)
    if key not in _DTYPE_NAMES:
        raise ValueError(f"Unknown dtype {name!r}; choose float32, bfloat16 or float16.")
    return _DTYPE_NAMES[key]


def check_writable_dtype(dtype: torch.dtype) -> None:
    """``ValueError`` unless checkpoints may be written in ``dtype`` (float32, bfloat16 or float16)."""
    if dtype not in _DTYPE_NAMES.values():
        raise ValueError(f"Cannot save in {dtype}; choose torch.float32, torch.bfloat16 or torch.float16.")


@dataclass(frozen=True)
class WeightFileNames:
    """How a library names the weights of one model folder."""

    single: str
    """The one file when everything fits in one shard, e.g. ``model.safetensors``."""
    index: str
    """The index of a sharded folder, e.g. ``model.safetensors.index.json``."""

    def shard(self, number: int, count: int) -> str:
        """The name of shard ``number`` (from 1) of ``count``, e.g. ``model-00001-of-00003.safetensors``."""
        return f"{self.single.removesuffix('.safetensors')}-{number:05d}-of-{count:05d}.safetensors"


TRANSFORMERS_FILES = WeightFileNames("model.safetensors", "model.safetensors.index.json")
"""transformers' names (and titanpod's own ``model.safetensors``)."""
DIFFUSERS_FILES = WeightFileNames(
    "diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"
)
"""diffusers' names."""


def widest_float_dtype(codes: Iterable[str]) -> torch.dtype:
    """The widest floating dtype among safetensors dtype ``codes`` (what mixed files load in); float32 if none."""
    present = set(codes)
    return next((dtype for code, dtype in SAFETENSORS_DTYPES.items() if code in present), torch.float32)


def open_safetensors(path: Path) -> Any:
    """Open one safetensors file for its header and tensors; errors name the file and what is wrong."""
    if not path.is_file():
        raise FileNotFoundError(f"Shard {path} is listed in the index but missing.")
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as error:
        raise ValueError(f"Shard {path} is corrupted or truncated: {error}") from error


def read_index(index_path: Path) -> dict[str, list[str]]:
    """Shard file name -> tensor names it holds, from a ``*.safetensors.index.json`` weight map."""
    try:
        weight_map: dict[str, str] = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{index_path} is not a valid safetensors index: {error}") from error
    files: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        files.setdefault(file, []).append(name)
    return files


@dataclass(frozen=True)
class SafetensorsFiles:
    """The safetensors of one folder: which file holds which tensor. Nothing is kept open."""

    directory: Path
    """The folder the files are in."""
    files: Mapping[str, list[str]]
    """File name -> the tensor names it holds, in the order the index (or header) lists them."""

    @classmethod
    def find(cls, directory: Path | str, *names: WeightFileNames, hint: str = "") -> SafetensorsFiles:
        """The weights of ``directory``: the index or single file of the first of ``names`` (default
        transformers') found. ``FileNotFoundError`` when there is none, naming pickles if that is all there is;
        ``hint`` is added to that message. Files the folder's ``checksums.json`` lists are checked against it
        first: ``CheckpointError`` names one whose hash differs."""
        directory = Path(directory)
        for option in names or (TRANSFORMERS_FILES,):
            if (directory / option.index).is_file():
                files = read_index(directory / option.index)
                verify_weight_files(directory, [option.index, *files])
                return cls(directory, files)
            if (directory / option.single).is_file():
                return cls.single(directory / option.single)
        pickles = sorted(path.name for pattern in PICKLE_PATTERNS for path in directory.glob(pattern))
        if pickles:
            raise FileNotFoundError(
                f"{directory} holds only pickled weights ({', '.join(pickles)}), which titanpod never reads "
                f"(safetensors only): re-save them with save_pretrained(..., safe_serialization=True)."
            )
        wanted = " or ".join(f"{option.index} or {option.single}" for option in names or (TRANSFORMERS_FILES,))
        raise FileNotFoundError(f"No {wanted} in {directory}{hint}.")

    @classmethod
    def single(cls, path: Path) -> SafetensorsFiles:
        """One safetensors file, its tensor names read from its header (after its hash is checked, when the
        folder's ``checksums.json`` lists it)."""
        if path.is_file():
            verify_weight_files(path.parent, [path.name])
        return cls(path.parent, {path.name: list(open_safetensors(path).keys())})

    def _open(self) -> Iterator[tuple[str, list[str], Any]]:
        for file, names in self.files.items():
            yield file, names, open_safetensors(self.directory / file)

    def stored_dtypes(self) -> set[str]:
        """The safetensors dtype codes the files store, from the headers."""
        return {handle.get_slice(name).get_dtype() for _, _, handle in self._open() for name in handle.keys()}  # noqa: SIM118 - safe_open is not iterable

    def get_slice(self, name: str) -> Any:
        """A lazy handle on one tensor (``.get_shape()``, ``[rows]`` reads only those rows); ``KeyError`` if absent."""
        for file, names in self.files.items():
            if name in names:
                return open_safetensors(self.directory / file).get_slice(name)
        raise KeyError(f"No tensor {name} in the safetensors of {self.directory}.")

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor by name, one file open at a time."""
        for _, names, handle in self._open():
            for name in names:
                yield name, handle.get_tensor(name)

    def check(
        self,
        expected: Mapping[str, tuple[int, ...]],
        subject: str,
        sources: Mapping[str, str] | None = None,
        hint: str = "",
    ) -> set[str]:
        """Hold every stored tensor's name and shape against ``expected``, reading headers only; return the
        dtype codes of the stored tensors.

        Every problem is collected, then raised together as one ``CheckpointMismatchError`` that begins
        with ``subject`` (e.g. ``<folder> does not fit the model``) and ends with ``hint``. ``sources``
        names, for the message, where a missing tensor would have gone.
        """
        sources = sources or {}
        problems: list[str] = []
        seen: set[str] = set()
        dtypes: set[str] = set()
        for file, names, handle in self._open():
            stored = set(handle.keys())
            for name in names:
                if name not in stored:
                    problems.append(f"missing: {name} is listed for {file} but not stored in it")
                    seen.add(name)
                elif name not in expected:
                    problems.append(f"unexpected: {name} (in {file})")
                else:
                    seen.add(name)
                    header = handle.get_slice(name)
                    dtypes.add(header.get_dtype())
                    shape = tuple(header.get_shape())
                    if shape != expected[name]:
                        problems.append(
                            f"mis-shaped: {name} (in {file}) is {shape}, the model expects {expected[name]}"
                        )
        for name in sorted(set(expected) - seen):
            problems.append(f"missing: {name}" + (f" ({sources[name]})" if name in sources else ""))
        if problems:
            listing = "\n  ".join(problems)
            raise CheckpointMismatchError(
                f"{subject} ({len(problems)} problems):\n  {listing}" + (f"\n{hint}" if hint else "")
            )
        return dtypes

    def load_into(self, targets: Mapping[str, torch.Tensor], progress: Progress | None = None) -> None:
        """Copy each stored tensor into ``targets[name]`` (converting dtype and device), one file at a time.

        Call ``check`` first: every stored name must be a key of ``targets``.
        """
        with torch.no_grad():
            for number, (file, names, handle) in enumerate(self._open(), 1):
                start = time.perf_counter()
                for name in names:
                    targets[name].copy_(handle.get_tensor(name))
                if progress is not None:
                    progress(
                        f"read {file} ({number}/{len(self.files)}, {len(names)} tensors, "
                        f"{time.perf_counter() - start:.2f} s)"
                    )


def plan_shards(entries: Iterable[TensorEntry], max_shard_bytes: int | None) -> list[list[TensorEntry]]:
    """Group ``entries``, in order, into shards of at most ``max_shard_bytes`` as stored; a larger tensor
    gets a shard of its own; ``None``: one shard."""
    shards: list[list[TensorEntry]] = [[]]
    size = 0
    for entry in entries:
        if max_shard_bytes is not None and shards[-1] and size + entry.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += entry.nbytes
    return shards


def write_safetensors(
    directory: Path,
    tensors: Iterable[tuple[str, torch.Tensor]],
    names: WeightFileNames = TRANSFORMERS_FILES,
    max_shard_bytes: int | str | None = None,
    dtype: torch.dtype | None = None,
    metadata: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> list[str]:
    """Write named ``tensors`` into ``directory``; return the file names written.

    One ``names.single`` when everything fits in ``max_shard_bytes`` (an int or e.g. ``5GB``;
    ``None``: no limit), else shards ``names.shard(k, n)`` and ``names.index`` (total size and a
    sorted weight map). Tensors are stored in ``dtype`` (default: their own), each copied to the CPU,
    written and dropped before the next. Every header holds ``format: pt`` and ``metadata``.
    """
    listed = list(tensors)
    by_name = dict(listed)
    entries = [TensorEntry(name, tuple(tensor.shape), dtype or tensor.dtype) for name, tensor in listed]
    return write_streamed(directory, entries, by_name.__getitem__, names, max_shard_bytes, metadata, progress)


def write_streamed(
    directory: Path | None,
    entries: Sequence[TensorEntry],
    fetch: Callable[[str], TensorData | None],
    names: WeightFileNames = TRANSFORMERS_FILES,
    max_shard_bytes: int | str | None = None,
    metadata: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> list[str]:
    """Write the tensors ``entries`` describe into ``directory``, asking ``fetch(name)`` for each as its turn
    comes; return the file names written.

    Files are laid out as by ``write_safetensors`` (shards in ``entries``' order, then the index), each
    header written before any data. ``fetch`` gives a tensor or its row blocks in order (an iterator, which
    may gather each block just in time), so one block at a time need be in memory. It is called once per
    tensor, in an order fixed by ``entries`` alone: with ``directory=None`` the same calls happen and
    nothing is written (what ``fetch`` returns is iterated to its end and dropped), so every process of a
    job can take part in gathering each block while one writes. The writing process also records each
    file's size and hash, taken as its bytes are written, in ``checksums.json``.
    """
    limit = None if max_shard_bytes is None else parse_size(max_shard_bytes)
    shards = plan_shards(entries, limit)
    header = {"format": "pt", **(metadata or {})}
    files = [names.single] if len(shards) == 1 else [names.shard(k, len(shards)) for k in range(1, len(shards) + 1)]
    written: dict[str, dict[str, Any]] = {}
    for number, (file, shard) in enumerate(zip(files, shards, strict=True), 1):
        if directory is None:
            for entry in data_order(shard):
                data = fetch(entry.name)
                if data is not None and not isinstance(data, torch.Tensor):
                    for _ in data:  # take part in each block's gather
                        pass
            continue
        with StreamedFile(directory / file, shard, header) as stream:
            for entry in stream.order:
                data = fetch(entry.name)
                if data is None:
                    raise RuntimeError(f"No data for {entry.name} in the writing process; it cannot write {file}.")
                stream.append(data)
                del data  # before the next is fetched
        written[file] = manifest_entry(stream.size, stream.digest)
        if progress is not None:
            progress(f"wrote {file} ({number}/{len(shards)})")
    if len(shards) > 1 and directory is not None:
        weight_map = {entry.name: file for file, shard in zip(files, shards, strict=True) for entry in shard}
        total = sum(entry.nbytes for entry in entries)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        index_bytes = (json.dumps(index, indent=2) + "\n").encode("utf-8")
        (directory / names.index).write_bytes(index_bytes)
        written[names.index] = manifest_entry(len(index_bytes), digest_bytes(index_bytes))
    if directory is not None:
        write_weights_manifest(directory, written)
    return sorted(set(files))
