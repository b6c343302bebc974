"""Hugging Face checkpoints on disk: config.json plus sharded safetensors, read and written
one shard at a time, so a large model never sits in memory twice."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from titanpod.checkpoint.atomic import atomic_directory
from titanpod.checkpoint.errors import CheckpointMismatchError
from titanpod.models import Transformer, build_model
from titanpod.models.adapters.decoder import hf_name_to_slot, hf_tensors
from titanpod.models.adapters.decoder_config import args_from_hf_config, hf_config_from_args

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1000**3

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}

Progress = Callable[[str], None]
"""Called with a line of progress text (e.g. ``print``)."""


def parse_size(text: str | int) -> int:
    """Bytes from ``5GB``, ``500MB``, ``2GiB`` or a plain integer; ``ValueError`` otherwise."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"Cannot read the size {text!r}; write it like 5GB, 500MB or 2GiB.")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "B").lower()])


def dtype_from_name(name: str) -> torch.dtype:
    """``torch.float32`` from ``float32`` (also ``bf16``, ``fp16``, ``fp32``)."""
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    key = aliases.get(name, name)
    if key not in _DTYPES:
        raise ValueError(f"Unknown dtype {name!r}; choose float32, bfloat16 or float16.")
    return _DTYPES[key]


def read_hf_config(directory: Path) -> tuple[str, dict]:
    """The parsed config.json of a checkpoint directory, with errors that name the file."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"No {CONFIG_FILE} in {directory}: not a Hugging Face checkpoint directory.")
    try:
        return str(path), json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


def shard_files(
    directory: Path | str, index_file: str = INDEX_FILE, single_file: str = SINGLE_FILE
) -> dict[str, list[str]]:
    """Shard file name -> tensor names it holds, from ``index_file`` or ``single_file``'s header (transformers'
    names by default); ``FileNotFoundError`` when the folder has neither."""
    directory = Path(directory)
    index_path = directory / index_file
    if index_path.is_file():
        return index_shard_files(index_path)
    single = directory / single_file
    if single.is_file():
        return {single_file: list(open_shard(single).keys())}
    raise FileNotFoundError(f"No {index_file} or {single_file} in {directory}.")


def index_shard_files(index_path: Path) -> dict[str, list[str]]:
    """Shard file name -> tensor names it holds, from a ``*.safetensors.index.json`` weight map."""
    try:
        weight_map: dict[str, str] = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{index_path} is not a valid safetensors index: {error}") from error
    files: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        files.setdefault(file, []).append(name)
    return files


def open_shard(path: Path):
    """Open one safetensors file for reading headers and tensors; errors name the file and what is wrong."""
    if not path.is_file():
        raise FileNotFoundError(f"Shard {path} is listed in the index but missing.")
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as error:
        raise ValueError(f"Shard {path} is corrupted or truncated: {error}") from error


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A model read from a Hugging Face checkpoint."""

    family: str
    """titanpod model family (``llama3``, ``qwen3``, ``qwen3_moe``)."""
    model: Transformer
    """The model, on the requested device, with every parameter filled from the files."""


def _validate(directory: Path, model: Transformer, files: dict[str, list[str]]) -> None:
    """Check every shard opens and every tensor's name and shape against the model, reading headers only."""
    params = dict(model.named_parameters())
    expected: set[tuple[str, int | None]] = set()
    for name, param in params.items():
        if ".experts." in name:
            expected.update((name, e) for e in range(param.shape[0]))
        else:
            expected.add((name, None))
    problems: list[str] = []
    seen: set[tuple[str, int | None]] = set()
    for file, names in files.items():
        handle = open_shard(directory / file)
        for hf_name in names:
            slot = hf_name_to_slot(hf_name)
            if slot is None or slot.name not in params or (slot.expert or 0) >= params[slot.name].shape[0]:
                problems.append(f"unexpected: {hf_name} (in {file})")
                continue
            seen.add((slot.name, slot.expert))
            target = params[slot.name] if slot.expert is None else params[slot.name][slot.expert]
            shape = tuple(handle.get_slice(hf_name).get_shape())
            if shape != tuple(target.shape):
                problems.append(
                    f"mis-shaped: {hf_name} (in {file}) is {shape}, the model expects {tuple(target.shape)}"
                )
    for name, expert in sorted(expected - seen, key=str):
        problems.append(f"missing: {name}" + (f" expert {expert}" if expert is not None else ""))
    if problems:
        listing = "\n  ".join(problems)
        raise CheckpointMismatchError(
            f"{directory} does not fit the model its config.json describes ({len(problems)} problems):\n  {listing}"
        )


def load_hf_checkpoint(
    directory: Path | str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    progress: Progress | None = None,
) -> LoadedCheckpoint:
    """Read a Hugging Face checkpoint directory into a titanpod model, shard by shard.

    The model is built on the meta device from config.json, materialised once on
    ``device`` (in ``dtype``, default the files' dtype), and filled tensor by tensor. Every
    name is checked against the model before any data is read: a missing, unexpected or
    mis-shaped tensor is a ``CheckpointMismatchError`` that names it.
    """
    directory = Path(directory)
    _, config = read_hf_config(directory)
    family, args = args_from_hf_config(config)
    files = shard_files(directory)
    model = build_model(family, args)
    _validate(directory, model, files)
    if dtype is None:
        dtype = _DTYPES.get(str(config.get("dtype", config.get("torch_dtype", "float32"))), torch.float32)
    model.to_empty(device=device)
    model.to(dtype)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for number, (file, names) in enumerate(files.items(), 1):
            start = time.perf_counter()
            handle = open_shard(directory / file)
            for hf_name in names:
                slot = hf_name_to_slot(hf_name)
                assert slot is not None  # _validate rejected unknown names
                target = params[slot.name] if slot.expert is None else params[slot.name][slot.expert]
                target.copy_(handle.get_tensor(hf_name))
            if progress is not None:
                progress(
                    f"read {file} ({number}/{len(files)}, {len(names)} tensors, {time.perf_counter() - start:.2f} s)"
                )
    return LoadedCheckpoint(family, model)


def plan_shards(
    tensors: Iterable[tuple[str, torch.Tensor]], max_shard_bytes: int, itemsize: int
) -> list[list[tuple[str, torch.Tensor]]]:
    """Group named tensors, in order, into shards of at most ``max_shard_bytes`` (a larger tensor gets its own)."""
    shards: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, tensor))
        size += nbytes
    return shards


def save_hf_checkpoint(
    model: Transformer,
    family: str,
    directory: Path | str,
    max_shard_size: str | int = DEFAULT_MAX_SHARD_BYTES,
    dtype: torch.dtype | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint: config.json and safetensors shards.

    Shards are ``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json``
    when more than one is needed (``max_shard_size``, e.g. ``5GB``), else one
    ``model.safetensors``. Each shard is copied to the CPU, written and dropped before the
    next. The directory appears only when complete.
    """
    dtype = dtype or model.tok_embeddings.weight.dtype
    dtype_name = next(name for name, value in _DTYPES.items() if value == dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    shards = plan_shards(hf_tensors(model), parse_size(max_shard_size), itemsize)
    directory = Path(directory)
    with atomic_directory(directory) as staging:
        config = hf_config_from_args(family, model.args, dtype_name)
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        write_shards(staging, shards, dtype, "model", SINGLE_FILE, INDEX_FILE, progress)
    return directory


def write_shards(
    directory: Path,
    shards: list[list[tuple[str, torch.Tensor]]],
    dtype: torch.dtype,
    stem: str,
    single_file: str,
    index_file: str,
    progress: Progress | None = None,
) -> None:
    """Write ``shards`` (from ``plan_shards``) in ``dtype`` as ``<stem>-00001-of-0000N.safetensors`` files and
    their ``index_file`` (``single_file`` alone when there is one shard), one shard in memory at a time."""
    weight_map: dict[str, str] = {}
    total = 0
    for number, shard in enumerate(shards, 1):
        file = single_file if len(shards) == 1 else f"{stem}-{number:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: tensor.detach().to("cpu", dtype).contiguous() for name, tensor in shard}
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(tensors, file))
        del tensors
        if progress is not None:
            progress(f"wrote {file} ({number}/{len(shards)})")
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (directory / index_file).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def iter_hf_tensors(directory: Path | str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a Hugging Face checkpoint directory by name, one shard open at a time."""
    directory = Path(directory)
    for file, names in shard_files(directory).items():
        handle = open_shard(directory / file)
        for name in names:
            yield name, handle.get_tensor(name)
