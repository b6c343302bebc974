"""titanpod-pretrain whose rank 0 finds the disk full: ``python full_disk_on_rank0.py WHAT ARGS...`` under torchrun.

``WHAT`` is ``weights`` (part way through streaming the final weights into their file, while the other ranks
gather tensors for it) or ``checkpoint`` (writing its share of the first sharded trainer-state save)."""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from torch.distributed.checkpoint import filesystem

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


def no_space(*args: Any, **kwargs: Any) -> None:
    """A write to a full disk."""
    raise OSError(errno.ENOSPC, "No space left on device")


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    if os.environ.get("RANK") == "0" and what == "weights":
        disk_full_after(WRITES_BEFORE_FULL)
    if os.environ.get("RANK") == "0" and what == "checkpoint":
        filesystem._write_item = no_space  # each item DCP writes into a file of this rank
    sys.exit(main(args))
