"""The FLUX autoencoder on disk in diffusers' folder layout: config.json plus safetensors.

A folder holds ``diffusion_pytorch_model.safetensors``, or shards
``diffusion_pytorch_model-0000k-of-0000n.safetensors`` listed in
``diffusion_pytorch_model.safetensors.index.json``, as ``AutoencoderKL.save_pretrained``
writes them. A FLUX pipeline folder (with a ``vae/`` subfolder) is read too. Only
safetensors are read or written, never pickles.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from titanpod.checkpoint.atomic import atomic_directory
from titanpod.checkpoint.errors import CheckpointMismatchError
from titanpod.checkpoint.hf_files import (
    CONFIG_FILE,
    index_shard_files,
    open_shard,
    parse_size,
    plan_shards,
    read_hf_config,
)
from titanpod.models.adapters.flux_autoencoder import (
    autoencoder_args_from_diffusers_config,
    diffusers_config_from_autoencoder_args,
    diffusers_names,
    diffusers_tensors,
)
from titanpod.models.flux.autoencoder import FluxAutoencoder, build_flux_autoencoder

WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"
"""The single weights file of a diffusers model folder."""
INDEX_FILE = "diffusion_pytorch_model.safetensors.index.json"
"""The shard index of a sharded diffusers model folder."""
PIPELINE_SUBFOLDER = "vae"
"""Where a FLUX pipeline folder keeps its autoencoder."""
DEFAULT_MAX_SHARD_BYTES = 10 * 1000**3
"""diffusers' default largest shard (10 GB): the FLUX autoencoder (335 MB in float32) fits in one file."""

_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _model_folder(directory: Path) -> Path:
    """``directory`` itself, or its ``vae/`` subfolder when it is a pipeline folder."""
    if not (directory / CONFIG_FILE).is_file() and (directory / PIPELINE_SUBFOLDER / CONFIG_FILE).is_file():
        return directory / PIPELINE_SUBFOLDER
    return directory


def _weight_files(directory: Path) -> dict[str, list[str]]:
    """File name -> tensor names it holds, from the index or from the single file's header."""
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        return index_shard_files(index_path)
    single = directory / WEIGHTS_FILE
    if single.is_file():
        return {WEIGHTS_FILE: list(open_shard(single).keys())}
    found = sorted(p.name for p in directory.glob("diffusion_pytorch_model*"))
    hint = f" (found {', '.join(found)}; titanpod reads safetensors only)" if found else ""
    raise FileNotFoundError(f"No {INDEX_FILE} or {WEIGHTS_FILE} in {directory}{hint}.")


def _check(directory: Path, model: FluxAutoencoder, files: dict[str, list[str]]) -> torch.dtype:
    """Every tensor's name and shape against the model, reading headers only; the files' dtype."""
    by_name = diffusers_names(model)
    params = dict(model.named_parameters())
    problems: list[str] = []
    seen: set[str] = set()
    dtypes: set[str] = set()
    for file, names in files.items():
        handle = open_shard(directory / file)
        stored = set(handle.keys())
        for name in names:
            if name not in stored:
                problems.append(f"missing from its file: {name} (the index puts it in {file})")
                continue
            tensor = handle.get_slice(name)
            if name not in by_name:
                problems.append(f"unexpected: {name} (in {file})")
                continue
            seen.add(name)
            dtypes.add(tensor.get_dtype())
            shape = tuple(tensor.get_shape())
            expected = tuple(params[by_name[name]].shape)
            if shape != expected:
                problems.append(f"mis-shaped: {name} (in {file}) is {shape}, the model expects {expected}")
    problems.extend(f"missing: {name}" for name in sorted(set(by_name) - seen))
    if problems:
        listing = "\n  ".join(problems)
        raise CheckpointMismatchError(
            f"{directory} does not fit the autoencoder its config.json describes ({len(problems)} problems):\n"
            f"  {listing}"
        )
    unknown = sorted(dtypes - set(_SAFETENSORS_DTYPES))
    if unknown:
        raise ValueError(f"{directory} stores tensors as {', '.join(unknown)}; titanpod reads F32, BF16 and F16.")
    # Mixed files load in the widest dtype present.
    for code in ("F32", "BF16", "F16"):
        if code in dtypes:
            return _SAFETENSORS_DTYPES[code]
    return torch.float32


def load_flux_autoencoder(
    directory: Path | str, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> FluxAutoencoder:
    """Read a diffusers ``AutoencoderKL`` folder (or a FLUX pipeline folder's ``vae/``) into a ``FluxAutoencoder``.

    The model is built on the meta device from config.json (unsupported settings are
    errors naming the key), every tensor name and shape is checked from the file headers
    before any data is read (a missing, unexpected or mis-shaped tensor is a
    ``CheckpointMismatchError`` naming it), then the model is materialised on ``device``
    in ``dtype`` (default: the files' dtype) and filled file by file. Returned in eval mode.
    """
    directory = _model_folder(Path(directory))
    _, config = read_hf_config(directory)
    model = build_flux_autoencoder(autoencoder_args_from_diffusers_config(config))
    files = _weight_files(directory)
    stored_dtype = _check(directory, model, files)
    model.to_empty(device=device)
    model.to(dtype or stored_dtype)
    by_name = diffusers_names(model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for file, names in files.items():
            handle = open_shard(directory / file)
            for name in names:
                params[by_name[name]].copy_(handle.get_tensor(name))
    return model.eval()


def save_flux_autoencoder(
    model: FluxAutoencoder,
    directory: Path | str,
    max_shard_bytes: int | str = DEFAULT_MAX_SHARD_BYTES,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``model`` as diffusers' ``AutoencoderKL`` folder: config.json and safetensors.

    One ``diffusion_pytorch_model.safetensors`` when everything fits in ``max_shard_bytes``
    (an integer or a size such as ``500MB``), else numbered shards and their index. Tensors
    are written in ``dtype`` (default: the model's). The folder appears only when complete;
    ``AutoencoderKL.from_pretrained`` reads it.
    """
    dtype = dtype or next(model.parameters()).dtype
    if dtype not in _SAFETENSORS_DTYPES.values():
        raise ValueError(f"Cannot save in {dtype}; choose torch.float32, torch.bfloat16 or torch.float16.")
    limit = parse_size(max_shard_bytes)
    itemsize = torch.empty((), dtype=dtype).element_size()
    shards = plan_shards(diffusers_tensors(model), limit, itemsize)
    directory = Path(directory)
    weight_map: dict[str, str] = {}
    total = 0
    with atomic_directory(directory) as staging:
        config = diffusers_config_from_autoencoder_args(model.args)
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        for number, shard in enumerate(shards, 1):
            file = (
                WEIGHTS_FILE
                if len(shards) == 1
                else f"diffusion_pytorch_model-{number:05d}-of-{len(shards):05d}.safetensors"
            )
            tensors = {name: tensor.detach().to("cpu", dtype).contiguous() for name, tensor in shard}
            save_file(tensors, str(staging / file), metadata={"format": "pt"})
            total += sum(t.numel() * t.element_size() for t in tensors.values())
            weight_map.update(dict.fromkeys(tensors, file))
            del tensors
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (staging / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return directory
