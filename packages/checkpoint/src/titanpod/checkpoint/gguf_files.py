"""GGUF files (llama.cpp's format) as a starting point: checked, read and dequantized by transformers' own GGUF
loading (with gguf's reader), and written as a Hugging Face folder, the one form every run starts from.

A GGUF file holds the model's shape, its (often quantized) tensors, and its tokenizer and chat template as metadata.
``check_gguf`` reads the metadata alone and refuses, naming the file, what cannot become a titanpod model: a file
that is not GGUF or is cut short, an architecture no titanpod family has, a quantization gguf cannot dequantize,
a file without its tokenizer. ``write_gguf_as_hf`` writes the folder (float32 by default: the dequantized values
exactly); ``gguf_as_hf_folder`` does it once per file content into a cache, for ``--model.init-from x.gguf``.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from titanpod.checkpoint.checksums import file_digest
from titanpod.checkpoint.companion_files import read_companions
from titanpod.checkpoint.hf_files import save_hf_checkpoint
from titanpod.checkpoint.hf_folder import CONFIG_FILE
from titanpod.checkpoint.safetensors_io import Progress
from titanpod.checkpoint.special_tokens import SpecialTokens
from titanpod.models import Transformer
from titanpod.models.adapters import DecoderAdapter, adapter_of_hf_config

GGUF_SUFFIX = ".gguf"
"""The suffix of a GGUF file."""
GGUF_MAGIC = b"GGUF"
"""The four bytes every GGUF file starts with."""
ARCHITECTURES = {"llama": "llama", "qwen3": "qwen3"}
"""GGUF ``general.architecture`` -> the transformers ``model_type`` a titanpod family reads (Llama 3, Qwen 3)."""
INSTALL_HINT = "pip install 'titanpod-checkpoint[gguf]' (gguf, transformers and accelerate)"
"""What to install when reading GGUF files finds a library missing."""


class GgufError(ValueError):
    """A GGUF file titanpod cannot start from: the file, what is wrong with it, and the way on."""


@dataclass(frozen=True)
class GgufSummary:
    """What a GGUF file's metadata says, read without its tensors."""

    path: Path
    """The file."""
    architecture: str
    """Its ``general.architecture`` (``llama``, ``qwen3``, ...)."""
    tensor_types: Mapping[str, int]
    """Each tensor type (``Q4_1``, ``F32``, ...) -> how many tensors are stored so."""
    head_dim: int | None = None
    """The heads' width the file states (``<arch>.attention.key_length``), if it states one."""

    def describe(self) -> str:
        """The file in words, e.g. ``m.gguf (llama, 272 tensors: 210 Q4_1, 61 F32, 1 Q8_0)``."""
        counts = ", ".join(f"{count} {name}" for name, count in Counter(self.tensor_types).most_common())
        return f"{self.path} ({self.architecture}, {sum(self.tensor_types.values())} tensors: {counts})"


@dataclass(frozen=True)
class GgufModel:
    """A GGUF file read into a titanpod model, with what travels beside the weights."""

    family: str
    """The titanpod family (``llama3``, ``qwen3``)."""
    adapter: DecoderAdapter
    """How the family's tensors are named in Hugging Face form."""
    model: Transformer
    """The model on the CPU, in float32: the dequantized values exactly."""
    special_tokens: SpecialTokens
    """The bos, eos and pad ids the file states."""
    files: Mapping[str, bytes]
    """The tokenizer's files (tokenizer.json, tokenizer_config.json, the chat template), by name."""


def find_gguf(source: str | Path) -> Path | None:
    """The GGUF file ``source`` names: a ``.gguf`` file, or a folder holding exactly one ``.gguf`` and no model
    description (config.json or model.json); ``None`` when it names something else. ``GgufError`` for a folder
    holding several, naming them."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() == GGUF_SUFFIX:
        return path
    if not path.is_dir() or (path / CONFIG_FILE).is_file() or (path / "model.json").is_file():
        return None
    found = sorted(child for child in path.iterdir() if child.suffix.lower() == GGUF_SUFFIX and child.is_file())
    if len(found) > 1:
        names = ", ".join(child.name for child in found)
        raise GgufError(f"{path} holds {len(found)} GGUF files ({names}); name the one to start from.")
    return found[0] if found else None


def _libraries() -> Any:
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loading needs it)
        import gguf
        import transformers  # noqa: F401
    except ImportError as error:
        raise GgufError(f"Reading a GGUF file needs {error.name}, which is not installed: {INSTALL_HINT}.") from error
    return gguf


def _dequantizable(gguf: Any, tensor: Any) -> bool:
    rows = tensor.data.reshape(-1, tensor.data.shape[-1]) if tensor.data.ndim > 1 else tensor.data[None]
    try:
        gguf.dequantize(rows[:1], tensor.tensor_type)
    except NotImplementedError:
        return False
    return True


def check_gguf(path: Path | str) -> GgufSummary:
    """Read ``path``'s metadata and check that it can become a titanpod model; ``GgufError`` otherwise, naming the
    file, the cause and the way on. Reads no tensor data beyond one row of each quantization type."""
    gguf = _libraries()
    path = Path(path)
    with path.open("rb") as handle:
        head = handle.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise GgufError(f"{path} is not a GGUF file: it starts with {head!r}, not {GGUF_MAGIC!r}.")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError) as error:
        raise GgufError(
            f"{path} cannot be read as GGUF ({error}); at {path.stat().st_size:,} bytes it is likely cut short or "
            "damaged: download or convert it again."
        ) from error
    field = reader.fields.get("general.architecture")
    architecture = str(field.contents()) if field is not None else "(none stated)"
    if architecture not in ARCHITECTURES:
        raise GgufError(
            f"{path} holds a {architecture!r} model; titanpod starts from GGUF files of the architectures "
            f"{', '.join(sorted(ARCHITECTURES))} (Llama 3, Qwen 3)."
        )
    types = Counter(tensor.tensor_type.name for tensor in reader.tensors)
    refused: dict[str, str] = {}
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        if name not in refused and not _dequantizable(gguf, tensor):
            refused[name] = tensor.name
    if refused:
        listed = ", ".join(f"{name} ({types[name]} tensors, e.g. {first})" for name, first in refused.items())
        raise GgufError(
            f"{path} holds tensors stored as {listed}, which gguf {metadata.version('gguf')} cannot dequantize; use "
            "a GGUF of another quantization (F32, F16, BF16, Q8_0, Q4_K, ...)."
        )
    if "tokenizer.ggml.tokens" not in reader.fields:
        raise GgufError(
            f"{path} holds no tokenizer (no tokenizer.ggml.tokens): titanpod trains and generates with the model's "
            "own tokenizer. Use a GGUF that embeds it (llama.cpp's convert_hf_to_gguf.py writes it), or start from "
            "the model's Hugging Face folder."
        )
    width = reader.fields.get(f"{architecture}.attention.key_length")
    return GgufSummary(path, architecture, dict(types), int(width.contents()) if width is not None else None)


def gguf_context_length(path: Path | str) -> int | None:
    """The context length a GGUF file states (``<arch>.context_length``); ``None`` when it states none or cannot be
    read (the run then says why)."""
    gguf = _libraries()
    try:
        reader = gguf.GGUFReader(path)
        architecture = reader.fields["general.architecture"].contents()
        return int(reader.fields[f"{architecture}.context_length"].contents())
    except (OSError, ValueError, KeyError, IndexError):
        return None


def read_gguf(path: Path | str, adapters: Mapping[str, DecoderAdapter], progress: Progress | None = None) -> GgufModel:
    """``path`` (checked first, ``check_gguf``) read with transformers' own GGUF loading, dequantized to float32, as
    a titanpod model of the family its architecture is; with its special token ids and tokenizer files.

    ``adapters`` (family -> adapter; ``titanpod.recipes.families.decoder_adapters()``) says which families the
    file's config may describe: an ``UnsupportedConfigError`` names a setting titanpod cannot represent."""
    summary = check_gguf(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = summary.path
    if progress is not None:
        progress(f"reading {summary.describe()} with transformers")
    # transformers reads no head width from a Qwen 3 file and takes its config's default (128): give the file's.
    stated = {"head_dim": summary.head_dim} if summary.head_dim is not None and summary.architecture != "llama" else {}
    hf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32, **stated)
    config = {key: value for key, value in hf_model.config.to_dict().items() if key != "quantization_config"}
    try:
        adapter = adapter_of_hf_config(config, adapters)
        args = adapter.args_from_hf_config(config)
    except ValueError as error:
        raise type(error)(f"{path}: {error}") from error
    hf_state = dict(hf_model.state_dict())
    del hf_model
    if args.tie_embeddings:
        hf_state.pop("lm_head.weight", None)
    model = Transformer(args)
    model.load_state_dict(adapter.from_hf(hf_state, args), strict=True)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    with tempfile.TemporaryDirectory(prefix="titanpod-gguf-tokenizer-") as folder:
        tokenizer.save_pretrained(folder)
        files = read_companions(folder)
    return GgufModel(adapter.family, adapter, model, SpecialTokens.from_config(config), files)


def write_gguf_as_hf(
    path: Path | str,
    out: Path | str,
    adapters: Mapping[str, DecoderAdapter],
    dtype: torch.dtype = torch.float32,
    progress: Progress | None = None,
    overwrite: bool = False,
) -> GgufModel:
    """Write the GGUF file ``path`` as a Hugging Face folder ``out`` (config.json, safetensors in ``dtype``,
    generation_config.json and the tokenizer's files with its chat template), appearing only when complete."""
    read = read_gguf(path, adapters, progress)
    save_hf_checkpoint(
        read.model,
        read.adapter,
        out,
        dtype=dtype,
        progress=progress,
        overwrite=overwrite,
        special_tokens=read.special_tokens,
        extra_files=read.files,
    )
    return read


def gguf_cache_dir() -> Path:
    """Where GGUF files become Hugging Face folders for a run: ``$XDG_CACHE_HOME/titanpod/gguf``, else
    ``~/.cache/titanpod/gguf``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "titanpod" / "gguf"


@contextmanager
def _held(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def gguf_as_hf_folder(
    path: Path | str,
    adapters: Mapping[str, DecoderAdapter],
    progress: Progress | None = None,
    cache_dir: Path | None = None,
) -> Path:
    """The Hugging Face folder (float32) of the GGUF file ``path``, written into ``cache_dir`` (``gguf_cache_dir()``)
    the first time this content is asked for and found there after: its name is the file's stem and a hash of its
    bytes, so a changed file is converted again. Processes asking at once wait for one another (a file lock)."""
    path = Path(path)
    check_gguf(path)
    cache_dir = gguf_cache_dir() if cache_dir is None else Path(cache_dir)
    folder = cache_dir / f"{path.stem}-{file_digest(path)[:16]}"
    if (folder / CONFIG_FILE).is_file():
        return folder
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise GgufError(
            f"Cannot make {cache_dir} to convert {path} into ({error}); point $XDG_CACHE_HOME at a writable folder, "
            "or convert it first with `titanpod-convert gguf` and start from that folder."
        ) from error
    with _held(cache_dir / f".{folder.name}.lock"):
        if not (folder / CONFIG_FILE).is_file():
            write_gguf_as_hf(path, folder, adapters, progress=progress)
            if progress is not None:
                progress(f"converted {path} into {folder}")
    return folder
