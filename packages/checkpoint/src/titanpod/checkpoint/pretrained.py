"""Weights a run starts from (``model.init_from``): a titanpod model folder, a Hugging Face checkpoint or a GGUF file,
read region by region so each process reads only the part of each parameter it holds."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from titanpod.checkpoint.gguf_files import GGUF_SUFFIX, find_gguf, gguf_as_hf_folder
from titanpod.checkpoint.hf_folder import CONFIG_FILE, config_errors_named, read_hf_config
from titanpod.checkpoint.hub import resolve_source
from titanpod.checkpoint.model_files import MODEL_FILE, read_model_description
from titanpod.checkpoint.model_tensors import identity_layout
from titanpod.checkpoint.region_reader import RegionReader, read_into_model
from titanpod.checkpoint.safetensors_io import TRANSFORMERS_FILES, Progress, SafetensorsFiles
from titanpod.checkpoint.weights import WEIGHTS_FILE
from titanpod.models import DecoderArgs, Transformer
from titanpod.models.adapters import DecoderAdapter, HFSlot, adapter_of_hf_config
from titanpod.models.common.args import args_from_dict

TOKENIZER_FILE = "tokenizer.json"
"""The file a folder's tokenizer is read from (``tokenizers``' own format, what transformers saves)."""
NOT_THE_SHAPE = frozenset({"max_seq_len", "moe.capacity_factor", "moe.aux_loss_coef"})
"""Args a run may choose whatever the weights: the planned sequence length and the routing and loss
settings of training. Every other field fixes the parameters or the arithmetic they were trained in."""


def in_meaning(args: DecoderArgs) -> DecoderArgs:
    """``args`` written one way only, so that two ways of saying the same model compare equal: ``head_dim`` as the
    width the heads have (``None`` and ``dim // n_heads`` are the same model)."""
    return dataclasses.replace(args, head_dim=args.resolved_head_dim)


def args_differences(found: DecoderArgs, wanted: DecoderArgs, ignore: frozenset[str] = NOT_THE_SHAPE) -> list[str]:
    """Each field (dotted for nested ones, e.g. ``moe.n_experts``) whose meaning differs, with both values:
    ``n_layers: 2 in the folder, 4 in the recipe``. Fields in ``ignore`` are skipped; a ``head_dim`` of ``None``
    equals one of ``dim // n_heads`` (``in_meaning``)."""

    def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in dataclasses.fields(value):
            inner = getattr(value, field.name)
            if dataclasses.is_dataclass(inner):
                out.update(flatten(inner, f"{prefix}{field.name}."))
            else:
                out[prefix + field.name] = inner
        return out

    theirs, ours = flatten(in_meaning(found)), flatten(in_meaning(wanted))
    names = [name for name in dict.fromkeys([*theirs, *ours]) if name not in ignore]
    return [
        f"{name}: {theirs.get(name)!r} in the folder, {ours.get(name)!r} in the recipe"
        for name in names
        if theirs.get(name) != ours.get(name)
    ]


@dataclass(frozen=True)
class PretrainedFolder:
    """A folder of weights to start from, described from its small files: nothing large is read yet."""

    source: str
    """What the user gave (a folder, or a Hub id)."""
    directory: Path
    """The local folder."""
    kind: str
    """``titanpod`` (model.json + model.safetensors, titanpod names), ``huggingface`` (config.json + safetensors) or
    ``gguf`` (a GGUF file, read from the Hugging Face folder it was converted into)."""
    family: str
    """The titanpod model family the folder holds."""
    args: DecoderArgs
    """The shape the folder's weights have."""
    files: SafetensorsFiles
    """Its safetensors."""
    hf_adapter: DecoderAdapter | None = None
    """How a ``huggingface`` folder's tensors are named (``None`` for a ``titanpod`` folder)."""

    def layout(self) -> dict[str, HFSlot]:
        """Stored tensor name -> the titanpod parameter (or expert of it) it fills."""
        if self.hf_adapter is not None:
            return dict(self.hf_adapter.hf_layout(self.args))
        with torch.device("meta"):
            model = Transformer(self.args)
        return identity_layout([name for name, _ in model.named_parameters()])

    @property
    def tokenizer_folder(self) -> Path | None:
        """The folder itself when it holds a tokenizer (``tokenizer.json``, with its ``tokenizer_config.json`` and
        chat template beside it, as ``titanpod-convert import`` and every export write them), else ``None``."""
        return self.directory if (self.directory / TOKENIZER_FILE).is_file() else None

    def describe(self) -> str:
        """The folder in words, e.g. ``org/name (huggingface folder, 4 safetensors files)``."""
        if self.kind == "gguf":
            return f"{self.source} (GGUF file, converted into {self.directory})"
        return f"{self.source} ({self.kind} folder, {len(self.files.files)} safetensors files)"

    def reader(
        self, model: nn.Module, dtype: torch.dtype | None = None, progress: Progress | None = None
    ) -> RegionReader:
        """A reader of any region of ``model``'s parameters from this folder (``titanpod.parallel``'s
        ``initial_values``), after every stored name and shape has been checked against the model
        (``CheckpointMismatchError`` names what is missing, unexpected or mis-shaped). ``model`` may be on the
        meta device, whole or sharded: only its (global) shapes are read. ``progress`` hears how far it is."""
        layout = self.layout()
        params = {name: torch.empty(param.shape, device="meta") for name, param in model.named_parameters()}
        expected = {name: tuple(slot.view(params[slot.name]).shape) for name, slot in layout.items()}
        sources = {name: f"titanpod {slot.describe()}" for name, slot in layout.items()}
        self.files.check(expected, f"{self.directory} does not fit the {self.family} model it describes", sources)
        return RegionReader(self.files, layout, dtype, progress)

    def load_into(self, model: nn.Module, progress: Progress | None = None) -> None:
        """Fill ``model`` (materialised: whole, or sharded with ``DTensor`` parameters) from the folder: each process
        reads only the slices of the stored tensors that fall in the parts of the parameters it holds (a whole
        model reads everything). Names and shapes are checked before any data is read."""
        read_into_model(model, self.reader(model, progress=progress))


def open_pretrained(
    source: str, adapters: Mapping[str, DecoderAdapter], progress: Progress | None = None
) -> PretrainedFolder:
    """The folder ``source`` names (a local folder, or a Hub id pulled into the cache), described.

    ``adapters`` (family -> adapter; ``titanpod.recipes.families.decoder_adapters()`` for the families titanpod
    ships) says which families a Hugging Face config.json may describe. A GGUF file (or a folder holding one) is
    converted into a Hugging Face folder first, once (``gguf_files.gguf_as_hf_folder``; ``progress`` hears of it).

    ``FileNotFoundError`` when it holds neither model.json nor config.json; an ``UnsupportedConfigError``
    names the config.json field titanpod cannot represent; a ``GgufError`` a GGUF file titanpod cannot read.
    """
    if source.lower().endswith(GGUF_SUFFIX) and not Path(source).expanduser().exists():
        raise FileNotFoundError(f"model.init_from {source!r}: no such GGUF file.")
    gguf_file = find_gguf(source)
    if gguf_file is not None:
        converted = open_pretrained(str(gguf_as_hf_folder(gguf_file, adapters, progress)), adapters)
        return dataclasses.replace(converted, source=source, kind="gguf")
    directory = resolve_source(source)
    if (directory / MODEL_FILE).is_file():
        family, args = read_model_description(directory)
        if not (directory / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"{directory} has {MODEL_FILE} but no {WEIGHTS_FILE}: the folder is incomplete.")
        return PretrainedFolder(
            source,
            directory,
            "titanpod",
            family,
            args_from_dict(args),
            SafetensorsFiles.single(directory / WEIGHTS_FILE),
        )
    if (directory / CONFIG_FILE).is_file():
        path, config = read_hf_config(directory)
        with config_errors_named(path):
            adapter = adapter_of_hf_config(config, adapters)
            args = adapter.args_from_hf_config(config)
        files = SafetensorsFiles.find(directory, TRANSFORMERS_FILES)
        return PretrainedFolder(source, directory, "huggingface", adapter.family, args, files, adapter)
    raise FileNotFoundError(
        f"model.init_from {source!r} holds neither {MODEL_FILE} (a titanpod model folder such as <run>/model) nor "
        f"{CONFIG_FILE} (a Hugging Face checkpoint)."
    )
