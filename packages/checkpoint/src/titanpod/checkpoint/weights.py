"""Model weights as safetensors, with strict key accounting on load."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from titanpod.checkpoint.atomic import atomic_directory
from titanpod.checkpoint.errors import CheckpointMismatchError

WEIGHTS_FILE = "model.safetensors"


def _distinct_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers by name; a tied parameter appears once, first name."""
    persistent = set(model.state_dict().keys())
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters())
    tensors.update((name, buf) for name, buf in model.named_buffers() if name in persistent)
    return tensors


def save_weights(
    model: nn.Module,
    directory: Path,
    metadata: Mapping[str, object] | None = None,
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Write ``model``'s weights to ``directory/model.safetensors``, atomically; return the file.

    ``metadata`` is stored as JSON strings in the safetensors header; ``extra_files`` maps
    file names to text written beside the weights (a recipe, a config). The directory
    appears only when everything in it is complete.
    """
    header = {"format": "pt", **{key: json.dumps(value) for key, value in (metadata or {}).items()}}
    with atomic_directory(Path(directory)) as staging:
        save_file(
            {name: t.detach().cpu().contiguous() for name, t in _distinct_tensors(model).items()},
            str(staging / WEIGHTS_FILE),
            metadata=header,
        )
        for name, text in (extra_files or {}).items():
            (staging / name).write_text(text, encoding="utf-8")
    return Path(directory) / WEIGHTS_FILE


def load_weights(model: nn.Module, path: Path) -> None:
    """Load ``path`` (a ``model.safetensors`` or its directory) into ``model``, strictly.

    Raises ``FileNotFoundError`` for a missing file and ``CheckpointMismatchError`` listing
    every missing, unexpected or mis-shaped tensor before touching the model.
    """
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"No weights at {path}: expected a {WEIGHTS_FILE} written by titanpod.")
    tensors = _distinct_tensors(model)
    expected = {name: tuple(t.shape) for name, t in tensors.items()}
    with safe_open(str(path), framework="pt") as handle:
        found = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118 - safe_open is not iterable
        problems = [f"missing: {name} {shape}" for name, shape in expected.items() if name not in found]
        problems += [f"unexpected: {name} {shape}" for name, shape in found.items() if name not in expected]
        problems += [
            f"mis-shaped: {name} is {found[name]} in the file, {shape} in the model"
            for name, shape in expected.items()
            if name in found and found[name] != shape
        ]
        if problems:
            listing = "\n  ".join(problems)
            raise CheckpointMismatchError(
                f"{path} does not fit the model ({len(problems)} problems):\n  {listing}\n"
                "Check that the recipe's model family and flavor match the ones that wrote it."
            )
        with torch.no_grad():
            for name, tensor in tensors.items():
                tensor.copy_(handle.get_tensor(name))


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def stored_dtype(path: Path) -> torch.dtype:
    """The floating dtype of the first tensor in a ``model.safetensors`` (or its directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_FILE
    with safe_open(str(path), framework="pt") as handle:
        for name in handle.keys():  # noqa: SIM118 - safe_open is not iterable
            dtype = handle.get_slice(name).get_dtype()
            if dtype in _SAFETENSORS_DTYPES:
                return _SAFETENSORS_DTYPES[dtype]
    return torch.float32
