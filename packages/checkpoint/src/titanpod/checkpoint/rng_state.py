"""The random state a trainer checkpoint holds, so that a resumed run draws what the uninterrupted run would have.

Saved under ``rng``: PyTorch's CPU generator (``torch_cpu``) and, when the model trains on a CUDA GPU, that
GPU's generator (``cuda``), which dropout on the GPU draws from. Each process saves its own; the states
of a data-parallel job are equal on every rank (each seeds alike and draws alike), and DCP keeps one copy.

What is not saved, because nothing is left to save: the data orders, synthetic batches, rollout sampling and
diffusion noise draw from generators of their own, made afresh from the seed and the batch or sample they
are for, and their position is the data state ``trainer.json`` records. titanpod draws nothing from Python's
``random`` or NumPy's global generator.

A checkpoint is loaded with the entries it holds (``rng_like``): one saved on a GPU loads on a CPU (its
``cuda`` entry is read and not applied), and one saved on a CPU loads on a GPU (the GPU keeps its seed).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

RNG_KEY = "rng"
"""The top-level entry of the trainer state that holds the generators."""


def rng_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The generators a run of ``model`` draws from, as tensors: ``torch_cpu``, and ``cuda`` (the generator of
    the GPU ``model``'s parameters are on) when it trains on one."""
    state = {"torch_cpu": torch.get_rng_state()}
    device = _cuda_device(model)
    if device is not None:
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def rng_like(shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, torch.Tensor]:
    """Tensors to load a checkpoint's generators into: one per ``rng.NAME`` entry of ``shapes`` (its DCP tensor
    shapes, ``titanpod.checkpoint.dcp_reader.tensor_shapes``), named ``NAME``."""
    prefix = f"{RNG_KEY}."
    return {
        key.removeprefix(prefix): torch.empty(shape, dtype=dtype)
        for key, (shape, dtype) in shapes.items()
        if key.startswith(prefix)
    }


def restore_rng_state(state: Mapping[str, torch.Tensor], model: nn.Module) -> None:
    """Set the generators ``rng_state`` saved: the CPU's, and the GPU's where ``model`` trains on one and the
    checkpoint holds one (else that generator is left as it is)."""
    if "torch_cpu" in state:
        torch.set_rng_state(state["torch_cpu"])
    device = _cuda_device(model)
    if device is not None and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _cuda_device(model: nn.Module) -> torch.device | None:
    """The CUDA device ``model``'s first parameter is on (a DTensor's local shard for a sharded one), or ``None``."""
    for parameter in model.parameters():
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        return local.device if local.device.type == "cuda" else None
    return None
