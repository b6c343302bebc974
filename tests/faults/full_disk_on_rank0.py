"""titanpod-pretrain whose rank 0 finds the disk full part way through streaming the final weights into their file:
``python full_disk_on_rank0.py ARGS...`` under torchrun. The other ranks are gathering tensors for rank 0 then."""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from titanpod.checkpoint import safetensors_stream
from titanpod.pretrain.cli import main

WRITES_BEFORE_FULL = 3
"""Tensors rank 0 writes before the disk is full."""


def disk_full_after(writes: int) -> None:
    """Make every streamed safetensors file of this process fail with ENOSPC after ``writes`` tensors."""
    append = safetensors_stream.StreamedFile.append
    done = [0]

    def full_disk_append(self: Any, data: Any) -> None:
        done[0] += 1
        if done[0] > writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        append(self, data)

    safetensors_stream.StreamedFile.append = full_disk_append


if __name__ == "__main__":
    if os.environ.get("RANK") == "0":
        disk_full_after(WRITES_BEFORE_FULL)
    sys.exit(main(sys.argv[1:]))
