"""A model's tensors on their way to safetensors, whole or sharded, one at a time.

Each tensor written is a slot (``HFSlot``: a whole parameter, one expert of it, or a row range) of
one parameter. When the parameter is a sharded ``DTensor``, the slot reaches the writing process in
row blocks of at most ``safetensors_stream.BLOCK_BYTES``, each gathered when the writer asks for it
(``gather.gather_blocks``, a collective every rank takes part in) and written before the next, so the
writer holds its own shards plus one block, whatever the size of the tensor (a mixture-of-experts
export, whose file order interleaves a layer's three expert weights, gathers each expert's rows
alone), and the other processes only their shards. Every process calls ``fetch`` in the same order
and iterates what it returns to the end; only the writer gets blocks.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from titanpod.checkpoint.block_buffer import BlockBuffer
from titanpod.checkpoint.gather import WRITER_RANK, gather_blocks
from titanpod.checkpoint.safetensors_stream import TensorData, TensorEntry
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
        self._buffer = BlockBuffer()  # every gathered block in the same bytes: see block_buffer
        self.entries = [
            TensorEntry(name, _slot_shape(slot, params[slot.name]), dtype or params[slot.name].dtype)
            for name, slot in layout.items()
        ]
        """Every tensor to write, described from the parameters' (global) shapes alone."""

    def fetch(self, name: str) -> TensorData:
        """The tensor saved as ``name``: a view of a plain parameter, or for a sharded one an iterator of its
        row blocks (on the writer; empty on other processes). Iterating it is a collective: every rank must
        fetch the same names in the same order (each name once) and iterate each to its end. A block shares
        its bytes with the next one: write or copy it before asking for the next."""
        slot = self._layout[name]
        param = self._params[slot.name]
        if isinstance(param, DTensor):
            return gather_blocks(param, slot, self._buffer)
        return slot.view(param.detach())


def identity_layout(names: list[str]) -> dict[str, HFSlot]:
    """Each of ``names`` saved whole under its own name (titanpod's own ``model.safetensors``)."""
    return {name: HFSlot(name) for name in names}


def _slot_shape(slot: HFSlot, param: torch.Tensor) -> tuple[int, ...]:
    return tuple(slot.view(torch.empty(param.shape, device="meta")).shape)
