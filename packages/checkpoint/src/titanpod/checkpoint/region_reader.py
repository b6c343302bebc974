"""Reading any region of a model's parameters from safetensors, so each process reads only what it holds.

A region is one slice per dimension of a titanpod parameter (start and stop set), e.g. the rows a
rank holds under FSDP. Every adapter's conversion is a view per tensor (``HFSlot``: a whole
parameter, one expert of it, or a row range), so the part of each stored tensor that falls in a
region is itself a box of that tensor: it is read with safetensors' ``get_slice`` and nothing else
of the tensor is touched. No tensor is ever read whole to be cut afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from titanpod.checkpoint.safetensors_io import SAFETENSORS_DTYPES, Progress, SafetensorsFiles, open_safetensors
from titanpod.models import Region
from titanpod.models.adapters import HFSlot


def whole_region(shape: tuple[int, ...] | torch.Size) -> Region:
    """The region covering all of a tensor of ``shape``."""
    return tuple(slice(0, size) for size in shape)


def held_region(param: torch.Tensor) -> tuple[torch.Tensor, Region]:
    """The tensor this process holds of ``param`` and the region of the whole it covers: a ``DTensor``'s
    local shard and where its placements put it, or a plain tensor and all of it."""
    if not isinstance(param, DTensor):
        return param.data, whole_region(param.shape)
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    region = tuple(slice(start, start + size) for start, size in zip(offset, shape, strict=True))
    return param._local_tensor, region


def slot_part(slot: HFSlot, region: Region) -> tuple[Region, Region] | None:
    """Where ``slot``'s stored tensor meets ``region`` of its parameter: the box to read from the stored
    tensor and the box of the region it fills (relative to the region's start), or ``None`` if they do
    not meet."""
    starts = [piece.start for piece in region]
    if slot.expert is not None:
        if not region[0].start <= slot.expert < region[0].stop:
            return None
        offset = slot.expert - starts[0]
        return region[1:], (slice(offset, offset + 1), *(slice(0, p.stop - p.start) for p in region[1:]))
    inner = tuple(slice(0, piece.stop - piece.start) for piece in region)
    if slot.rows is None:
        return region, inner
    low, high = max(slot.rows[0], region[0].start), min(slot.rows[1], region[0].stop)
    if low >= high:
        return None
    read = (slice(low - slot.rows[0], high - slot.rows[0]), *region[1:])
    return read, (slice(low - starts[0], high - starts[0]), *inner[1:])


class RegionReader:
    """The values of any region of a model's parameters, from ``files`` stored in ``layout``'s names.

    Call it as ``reader(name, region)`` (the form ``titanpod.parallel``'s sharded creation takes) or
    fill a held tensor with ``read_into``. Only stored tensors that meet the region are opened, and
    only their part inside it is read. Check the files' names and shapes first (``SafetensorsFiles.check``).
    """

    def __init__(
        self,
        files: SafetensorsFiles,
        layout: Mapping[str, HFSlot],
        dtype: torch.dtype | None = None,
        progress: Progress | None = None,
    ) -> None:
        """``layout``: stored name -> slot of a titanpod parameter; ``dtype``: what ``reader(name, region)``
        returns (default: the stored tensor's own); ``progress`` hears every 50 parameters and the last."""
        self.files = files
        """Where the tensors are stored."""
        self.dtype = dtype
        """The dtype of tensors ``__call__`` returns (``None``: as stored)."""
        self.progress = progress
        """Called with a line of progress text, or ``None``."""
        self.bytes_read = 0
        """Bytes of stored data read so far."""
        self.parameters_read = 0
        """Parameter regions read so far."""
        self._slots: dict[str, list[tuple[str, HFSlot]]] = {}
        for stored, slot in layout.items():
            self._slots.setdefault(slot.name, []).append((stored, slot))
        self._file_of = {name: file for file, names in files.files.items() for name in names}
        self._handles: dict[str, Any] = {}

    def __call__(self, name: str, region: Region) -> torch.Tensor:
        """A new tensor holding parameter ``name`` over ``region``."""
        first_stored = self._slots[name][0][0]
        dtype = self.dtype or SAFETENSORS_DTYPES.get(self._slice(first_stored).get_dtype(), torch.float32)
        out = torch.empty([piece.stop - piece.start for piece in region], dtype=dtype)
        self.read_into(name, region, out)
        return out

    def read_into(self, name: str, region: Region, out: torch.Tensor) -> None:
        """Copy parameter ``name`` over ``region`` into ``out`` (of the region's shape; dtype and device converted)."""
        if name not in self._slots:
            raise KeyError(f"No stored tensor fills {name}.")
        with torch.no_grad():
            for stored, slot in self._slots[name]:
                part = slot_part(slot, region)
                if part is None:
                    continue
                read, into = part
                values = self._slice(stored)[read] if read else self._handle(stored).get_tensor(stored)
                self.bytes_read += values.numel() * values.element_size()
                target = out[into]
                target.copy_(values.view(target.shape))
        self.parameters_read += 1
        if self.progress is not None and (self.parameters_read % 50 == 0 or self.parameters_read == len(self._slots)):
            self.progress(
                f"read {self.parameters_read}/{len(self._slots)} parameters "
                f"({self.bytes_read / 1e6:,.1f} MB: this process's part)"
            )

    def close(self) -> None:
        """Let go of the open files."""
        self._handles.clear()

    def _handle(self, stored: str) -> Any:
        file = self._file_of[stored]
        if file not in self._handles:
            self._handles.clear()  # one file open at a time: files are read in order, mostly
            self._handles[file] = open_safetensors(self.files.directory / file)
        return self._handles[file]

    def _slice(self, stored: str) -> Any:
        return self._handle(stored).get_slice(stored)


def read_into_model(model: nn.Module, reader: RegionReader) -> None:
    """Fill every parameter of ``model`` (materialised; plain or ``DTensor``) with what ``reader`` reads of the
    part this process holds, parameter by parameter."""
    for name, param in model.named_parameters():
        held, region = held_region(param)
        reader.read_into(name, region, held)
    reader.close()
