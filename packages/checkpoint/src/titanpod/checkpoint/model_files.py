"""A titanpod model checkpoint: ``model.safetensors`` (titanpod names) and ``model.json``
(family and shape, the special token ids, and what is known of where the model came from), enough to rebuild
the model with no recipe at hand. The tokenizer and generation files that travel with it
(``companion_files``) sit beside them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from titanpod.checkpoint.companion_files import Files
from titanpod.checkpoint.special_tokens import SpecialTokens
from titanpod.checkpoint.weights import TensorSource, load_weights, save_weights, stored_dtype
from titanpod.models import Transformer
from titanpod.models.common.args import args_from_dict, args_to_dict

MODEL_FILE = "model.json"
"""The model's description in a titanpod checkpoint folder."""


def save_model(
    model: Transformer,
    family: str,
    directory: Path | str,
    metadata: Mapping[str, object] | None = None,
    extra_files: Files | None = None,
    overwrite: bool = True,
    special_tokens: SpecialTokens | None = None,
    about: Mapping[str, object] | None = None,
    source: TensorSource | None = None,
) -> Path:
    """Write weights and ``model.json`` into ``directory`` atomically; return the weights file.

    ``model.json`` records the family and args, ``special_tokens`` (bos, eos, pad ids) and ``about`` (what is
    known of the model's making: a source it was imported from, steps, tokens, final loss), read back by
    ``read_model_file``; ``extra_files`` (name -> text or bytes) are written beside the weights.

    A non-empty ``directory`` is refused unless ``overwrite``; then only the files written are replaced
    (``save_weights``). A sharded model is gathered one tensor at a time and written by one process: every process
    of its mesh must call this (see ``save_weights``). ``source``: the weights come from it, not from ``model``
    (which then gives the description alone, e.g. on the meta device; see ``save_weights``).
    """
    description: dict[str, object] = {"family": family, "args": args_to_dict(model.args)}
    if special_tokens:
        description["special_tokens"] = special_tokens.as_config()
    if about:
        description["about"] = dict(about)
    files = {MODEL_FILE: json.dumps(description, indent=2) + "\n", **(extra_files or {})}
    return save_weights(model, Path(directory), metadata, extra_files=files, overwrite=overwrite, source=source)


def read_model_file(directory: Path | str) -> dict:
    """A checkpoint's whole ``model.json``: ``family``, ``args`` and, when recorded, ``special_tokens`` and
    ``about``."""
    path = Path(directory) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"No {MODEL_FILE} in {directory}: not a titanpod model checkpoint.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


def read_model_description(directory: Path | str) -> tuple[str, dict]:
    """The family and args dict from a checkpoint's ``model.json``."""
    description = read_model_file(directory)
    return description["family"], description["args"]


def read_special_tokens(directory: Path | str) -> SpecialTokens:
    """The bos, eos and pad ids a checkpoint's ``model.json`` records (all ``None`` when it records none)."""
    return SpecialTokens.from_config(read_model_file(directory).get("special_tokens", {}))


def load_model(directory: Path | str, device: torch.device | str = "cpu") -> tuple[str, Transformer]:
    """Rebuild the model a checkpoint describes, on ``device``, and load its weights strictly."""
    family, args = read_model_description(directory)
    with torch.device("meta"):
        model = Transformer(args_from_dict(args))
    model.to_empty(device=device)
    model.to(stored_dtype(Path(directory)))
    load_weights(model, Path(directory))
    return family, model
