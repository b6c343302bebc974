"""Weights and completions as plain NumPy arrays, for sending between processes (Ray's object store).

A tensor travels as (dtype name, shape, its raw bytes as a uint8 array): NumPy arrays move through
Ray's shared-memory object store without copies or pickled torch objects, and every torch dtype
(bfloat16 included, which NumPy lacks) survives the round trip bit for bit.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping

import numpy as np
import torch

from titanpod.rl.rollout.sync import plain_tensor
from titanpod.rl.rollout.types import Completion

WireTensor = tuple[str, tuple[int, ...], np.ndarray]
"""A tensor on the wire: torch dtype name (``bfloat16``), shape, raw bytes (uint8, flat)."""


def tensor_to_wire(tensor: torch.Tensor) -> WireTensor:
    """``tensor`` (gathered to the CPU first if it lives elsewhere or is a DTensor) as a ``WireTensor``."""
    plain = plain_tensor(tensor)
    return str(plain.dtype).removeprefix("torch."), tuple(plain.shape), plain.reshape(-1).view(torch.uint8).numpy()


def tensor_from_wire(wire: WireTensor) -> torch.Tensor:
    """The tensor a ``WireTensor`` holds. It may share memory with a read-only array from the object
    store: read it or copy it, never write to it."""
    dtype_name, shape, raw = wire
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"Unknown tensor dtype {dtype_name!r} on the wire.")
    with warnings.catch_warnings():  # object-store arrays are read-only; the tensor is only read
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        flat = torch.from_numpy(raw)
    return flat.view(dtype).reshape(shape)


ByteTensor = tuple[str, list[int], bytes]
"""A tensor as plain data for a serializer that knows no tensors or arrays (vLLM's ``collective_rpc`` arguments):
torch dtype name, shape, raw bytes."""


def tensor_to_bytes(tensor: torch.Tensor) -> ByteTensor:
    """``tensor`` (gathered to the CPU first) as a ``ByteTensor`` (one copy of its bytes)."""
    dtype_name, shape, raw = tensor_to_wire(tensor)
    return dtype_name, list(shape), raw.tobytes()


def tensor_from_bytes(item: ByteTensor) -> torch.Tensor:
    """The tensor a ``ByteTensor`` holds (its own, writable memory)."""
    dtype_name, shape, raw = item
    return tensor_from_wire((dtype_name, tuple(shape), np.frombuffer(bytearray(raw), dtype=np.uint8)))


def state_to_wire(state: Mapping[str, torch.Tensor]) -> dict[str, WireTensor]:
    """Every tensor of ``state`` as a ``WireTensor``, by name."""
    return {name: tensor_to_wire(tensor) for name, tensor in state.items()}


def state_from_wire(wire: Mapping[str, WireTensor]) -> dict[str, torch.Tensor]:
    """The state ``state_to_wire`` sent."""
    return {name: tensor_from_wire(item) for name, item in wire.items()}


def completions_to_wire(completions: list[Completion]) -> list[Completion]:
    """``completions`` with their logprobs as NumPy arrays (fp32), ready to send."""
    return [dataclasses.replace(c, logprobs=c.logprobs.numpy()) for c in completions]


def completions_from_wire(completions: list[Completion]) -> list[Completion]:
    """``completions_to_wire``'s completions with torch logprobs again (copied: the result is writable)."""
    return [dataclasses.replace(c, logprobs=torch.tensor(np.asarray(c.logprobs))) for c in completions]
