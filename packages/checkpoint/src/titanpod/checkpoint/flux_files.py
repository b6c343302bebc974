"""FLUX.1 transformer checkpoints in diffusers' layout: config.json plus sharded safetensors.

A folder written by ``FluxTransformer2DModel.save_pretrained(..., safe_serialization=True)``
(the ``transformer/`` folder of a FLUX.1 pipeline) loads into a titanpod
``FluxTransformer``, and ``save_flux_transformer`` writes one that
``FluxTransformer2DModel.from_pretrained`` reads. Weights are
``diffusion_pytorch_model.safetensors``, or shards
``diffusion_pytorch_model-0000k-of-0000n.safetensors`` with
``diffusion_pytorch_model.safetensors.index.json``; a folder named the transformers way
(``model.safetensors`` and its index) is read too. Only safetensors: pickles are never read.

Key accounting is strict: every tensor name and shape is checked against the model,
reading headers only, before any data is read; a missing, unexpected or mis-shaped tensor
is a ``CheckpointMismatchError`` that names it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors import SafetensorError

from titanpod.checkpoint.atomic import atomic_directory
from titanpod.checkpoint.errors import CheckpointMismatchError
from titanpod.checkpoint.hf_files import (
    CONFIG_FILE,
    Progress,
    dtype_from_name,
    open_shard,
    parse_size,
    plan_shards,
    read_hf_config,
    shard_files,
    write_shards,
)
from titanpod.models.adapters.base import UnsupportedConfigError
from titanpod.models.adapters.flux_transformer import (
    flux_args_from_hf_config,
    flux_hf_config_from_args,
    flux_hf_layout,
    flux_hf_tensors,
)
from titanpod.models.flux import FluxArgs, FluxOps, FluxTransformer, build_flux_transformer

DIFFUSERS_SINGLE_FILE = "diffusion_pytorch_model.safetensors"
DIFFUSERS_INDEX_FILE = "diffusion_pytorch_model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 10 * 1000**3
"""diffusers' own default shard size (10GB)."""

_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
_PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt")


def read_flux_config(directory: Path | str) -> FluxArgs:
    """The ``FluxArgs`` of a diffusers FLUX transformer folder's config.json; errors name the file and key."""
    path, config = read_hf_config(Path(directory))
    try:
        return flux_args_from_hf_config(config)
    except UnsupportedConfigError as error:
        raise UnsupportedConfigError(f"{path}: {error}") from error


def flux_shard_files(directory: Path | str) -> dict[str, list[str]]:
    """Shard file name -> tensor names it holds, from diffusers' index or single file (or transformers' names)."""
    directory = Path(directory)
    for names in ((DIFFUSERS_INDEX_FILE, DIFFUSERS_SINGLE_FILE), ()):  # diffusers' file names, then transformers'
        try:
            return shard_files(directory, *names)
        except FileNotFoundError:
            continue
    pickles = sorted(path.name for pattern in _PICKLES for path in directory.glob(pattern))
    if pickles:
        raise FileNotFoundError(
            f"{directory} holds only pickled weights ({', '.join(pickles)}), which titanpod never reads: "
            f"re-save them with save_pretrained(..., safe_serialization=True)."
        )
    raise FileNotFoundError(
        f"No {DIFFUSERS_INDEX_FILE} or {DIFFUSERS_SINGLE_FILE} in {directory}: not a diffusers FLUX transformer "
        f"folder (in a pipeline folder, point at its transformer/ subfolder)."
    )


def _validate(directory: Path, model: FluxTransformer, files: dict[str, list[str]]) -> torch.dtype:
    """Check every shard opens and every tensor's name and shape, reading headers only; return the files' dtype."""
    layout = flux_hf_layout(model.args)
    params = dict(model.named_parameters())
    problems: list[str] = []
    seen: set[str] = set()
    dtype: torch.dtype | None = None
    for file, names in files.items():
        handle = open_shard(directory / file)
        for hf_name in names:
            slot = layout.get(hf_name)
            if slot is None:
                problems.append(f"unexpected: {hf_name} (in {file})")
                continue
            try:
                stored = handle.get_slice(hf_name)
            except SafetensorError:
                problems.append(f"missing: {hf_name} is listed for {file} but not stored in it")
                continue
            seen.add(hf_name)
            param = params[slot.name]
            expected = tuple(param.shape) if slot.rows is None else (slot.rows[1] - slot.rows[0], *param.shape[1:])
            shape = tuple(stored.get_shape())
            if shape != expected:
                problems.append(f"mis-shaped: {hf_name} (in {file}) is {shape}, the model expects {expected}")
            if dtype is None:
                dtype = _SAFETENSORS_DTYPES.get(stored.get_dtype(), torch.float32)
    for hf_name in sorted(set(layout) - seen):
        slot = layout[hf_name]
        rows = "" if slot.rows is None else f" rows {slot.rows[0]}:{slot.rows[1]}"
        if not any(problem.startswith(f"missing: {hf_name} ") for problem in problems):
            problems.append(f"missing: {hf_name} (titanpod {slot.name}{rows})")
    if problems:
        listing = "\n  ".join(problems)
        raise CheckpointMismatchError(
            f"{directory} does not fit the FLUX transformer its config.json describes ({len(problems)} problems):"
            f"\n  {listing}"
        )
    return dtype or torch.float32


def load_flux_transformer(
    directory: Path | str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    ops: FluxOps | None = None,
    progress: Progress | None = None,
) -> FluxTransformer:
    """Read a diffusers ``FluxTransformer2DModel`` folder into a titanpod ``FluxTransformer``, shard by shard.

    The model is built on the meta device from config.json, materialised once on
    ``device`` in ``dtype`` (default: the files' dtype), and filled tensor by tensor; a
    single-stream block's fused ``linear1`` is assembled from diffusers' q, k, v and MLP
    tensors. Names and shapes are all checked first: a missing, unexpected or mis-shaped
    tensor is a ``CheckpointMismatchError`` that names it.
    """
    directory = Path(directory)
    args = read_flux_config(directory)
    files = flux_shard_files(directory)
    model = build_flux_transformer(args, ops, device="meta")
    files_dtype = _validate(directory, model, files)
    dtype = dtype_from_name(dtype) if isinstance(dtype, str) else (dtype or files_dtype)
    model.to(dtype)
    model.to_empty(device=device)
    layout = flux_hf_layout(args)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for number, (file, names) in enumerate(files.items(), 1):
            start = time.perf_counter()
            handle = open_shard(directory / file)
            for hf_name in names:
                slot = layout[hf_name]
                target = params[slot.name]
                if slot.rows is not None:
                    target = target[slot.rows[0] : slot.rows[1]]
                target.copy_(handle.get_tensor(hf_name))
            if progress is not None:
                progress(
                    f"read {file} ({number}/{len(files)}, {len(names)} tensors, {time.perf_counter() - start:.2f} s)"
                )
    return model


def save_flux_transformer(
    model: FluxTransformer,
    directory: Path | str,
    max_shard_bytes: int | str = DEFAULT_MAX_SHARD_BYTES,
    dtype: torch.dtype | str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write ``model`` as a diffusers ``FluxTransformer2DModel`` folder: config.json and safetensors shards.

    Shards are ``diffusion_pytorch_model-0000k-of-0000n.safetensors`` with
    ``diffusion_pytorch_model.safetensors.index.json`` when more than one is needed
    (``max_shard_bytes``, an int or e.g. ``5GB``), else one
    ``diffusion_pytorch_model.safetensors``. Tensors are written in ``dtype`` (default the
    model's). Each shard is copied to the CPU, written and dropped before the next. The
    directory appears only when complete. Args diffusers cannot represent raise
    ``UnsupportedConfigError`` before anything is written.
    """
    config = flux_hf_config_from_args(model.args)
    if isinstance(dtype, str):
        dtype = dtype_from_name(dtype)
    dtype = dtype or model.img_in.weight.dtype
    itemsize = torch.empty((), dtype=dtype).element_size()
    shards = plan_shards(flux_hf_tensors(model), parse_size(max_shard_bytes), itemsize)
    directory = Path(directory)
    with atomic_directory(directory) as staging:
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        write_shards(
            staging, shards, dtype, "diffusion_pytorch_model", DIFFUSERS_SINGLE_FILE, DIFFUSERS_INDEX_FILE, progress
        )
    return directory
