"""One staging buffer the writer gathers every row block of a save into, instead of a fresh tensor a block.

A sharded save gathers thousands of blocks of up to ``safetensors_stream.BLOCK_BYTES`` on the writing process,
each written to the file before the next is gathered. Allocating each anew left the C allocator's heap holding
freed blocks of every size between them (a Llama 3.2 1B on 4 ranks: about 0.1 GiB above the shard and one block
on rank 0); one buffer, grown only when a block needs more, keeps the writer at its shard plus one block.
"""

from __future__ import annotations

import math

import torch


class BlockBuffer:
    """Bytes reused for each block: ``take`` gives a tensor over them, valid until the next ``take``."""

    def __init__(self) -> None:
        self._bytes: torch.Tensor | None = None

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` and ``dtype`` on ``device`` over the buffer's bytes (grown when
        too small, or moved when on another device); the tensor an earlier ``take`` gave now shares them."""
        needed = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if self._bytes is None or self._bytes.numel() < needed or self._bytes.device != device:
            self._bytes = None  # the old bytes go before the new ones are made
            self._bytes = torch.empty(max(needed, 1), dtype=torch.uint8, device=device)
        return self._bytes[:needed].view(dtype).view(shape)
