"""A model's tensors on their way to safetensors, whole or sharded, one at a time.

Each tensor written is a slot (``HFSlot``: a whole parameter, one expert of it, or a row range) of
one parameter. When the parameter is a sharded ``DTensor``, it is gathered whole on the writing
process only when its first slot's turn comes (``gather.gather_to_writer``, a collective every rank
takes part in) and dropped after its last slot is written, so the writer holds its own shards plus
the parameter being written (for a mixture-of-experts export, whose file order interleaves a layer's
three expert weights, those three) and the other processes only their shards. Every process calls
``fetch`` in the same order; only the writer gets tensors back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from titanpod.checkpoint.gather import WRITER_RANK, gather_to_writer
from titanpod.checkpoint.safetensors_stream import TensorEntry
from titanpod.models.adapters import HFSlot


def writes_here() -> bool:
    """Whether this process writes shared files: rank 0 (``gather.WRITER_RANK``) of torch.distributed's default
    group when one is joined, otherwise the only process."""
    return not dist.is_initialized() or dist.get_rank() == WRITER_RANK


def is_sharded(tensors: Mapping[str, torch.Tensor]) -> bool:
    """Whether any of ``tensors`` is a ``DTensor`` (so reading or writing it is a collective)."""
    return any(isinstance(tensor, DTensor) for tensor in tensors.values())


class ModelTensors:
    """The tensors ``layout`` names, cut from ``params`` (plain tensors or ``DTensor``s), to be written."""

    def __init__(
        self, layout: Mapping[str, HFSlot], params: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None
    ) -> None:
        """``layout``: file name -> slot of a parameter, in the order to write; ``params``: the parameters by
        name (shapes of ``DTensor``s are their global shapes); ``dtype``: the stored dtype (default: each
        parameter's own). ``KeyError`` names a parameter ``params`` lacks."""
        for name, slot in layout.items():
            if slot.name not in params:
                raise KeyError(f"The model has no {slot.name}, which the saved tensor {name} comes from.")
        self._layout = layout
        self._params = params
        self.entries = [
            TensorEntry(name, _slot_shape(slot, params[slot.name]), dtype or params[slot.name].dtype)
            for name, slot in layout.items()
        ]
        """Every tensor to write, described from the parameters' (global) shapes alone."""
        self._uses = Counter(slot.name for slot in layout.values())
        self._gathered: dict[str, torch.Tensor | None] = {}

    def fetch(self, name: str) -> torch.Tensor | None:
        """The whole tensor saved as ``name`` on the writer (``None`` on other processes when the parameter is
        sharded). A collective for a sharded parameter: every rank must fetch the same names in the same order
        (each name once)."""
        slot = self._layout[name]
        if slot.name in self._gathered:
            whole = self._gathered[slot.name]
        else:
            param = self._params[slot.name]
            with torch.no_grad():
                whole = gather_to_writer(param) if isinstance(param, DTensor) else param.detach()
        self._uses[slot.name] -= 1
        if self._uses[slot.name] > 0:
            self._gathered[slot.name] = whole
        else:
            self._gathered.pop(slot.name, None)
        return None if whole is None else slot.view(whole)


def identity_layout(names: list[str]) -> dict[str, HFSlot]:
    """Each of ``names`` saved whole under its own name (titanpod's own ``model.safetensors``)."""
    return {name: HFSlot(name) for name in names}


def _slot_shape(slot: HFSlot, param: torch.Tensor) -> tuple[int, ...]:
    return tuple(slot.view(torch.empty(param.shape, device="meta")).shape)
