"""The disk space a run's saves need, checked before its first step rather than found missing at its first save.

The bytes of a save are known once the model and its step are built: a checkpoint holds the parameters, the
optimizer's state (AdamW: two moments a parameter, counted at least as large as the parameters even before the
first step makes them) and the RNG; the final weights hold the parameters again. A run that saves checkpoints
needs room for one more on the checkpoint folder's disk (older ones are pruned only once a newer one is
complete), and a run that saves its weights needs room for them on the run directory's disk, each with a margin
(``SPACE_MARGIN``). A sharded model counts its shard once a rank. Where the free space cannot be read (an object
store), nothing is checked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from torch import nn
from torch.distributed.tensor import DTensor

from titanpod.checkpoint.disk_space import free_bytes, state_bytes
from titanpod.checkpoint.locations import Location, local_path

SPACE_MARGIN = 0.10
"""The share of the estimate asked for beyond it (files' metadata, a tokenizer, the estimate's own error)."""
SPACE_FLOOR = 64 * 2**20
"""The least room asked for beyond the estimate, in bytes."""


class NotEnoughSpaceError(OSError):
    """A disk has less free space than the run's saves need: names the folder, the bytes and what to do."""


@dataclass(frozen=True)
class SpaceNeed:
    """Bytes a run will write into one folder."""

    folder: Path
    """Where they go."""
    what: str
    """What they are (``a checkpoint``, ``the final weights``)."""
    bytes: int
    """How many (the whole job's, before the margin)."""


def save_needs(
    checkpoints: Location, run_dir: Path, model: nn.Module, optimizer_bytes: int, *, checkpoint: bool, weights: bool,
    ranks: int,
) -> list[SpaceNeed]:  # fmt: skip
    """What one checkpoint (``checkpoint``) and the final weights (``weights``) of ``model`` need, the job's whole
    (a sharded model's shard counted on each of ``ranks``); a checkpoint folder that is not local is left out."""
    params = state_bytes({name: param.detach() for name, param in model.named_parameters()})
    sharded = any(
        isinstance(param, DTensor) and any(placement.is_shard() for placement in param.placements)
        for param in model.parameters()
    )
    copies = ranks if sharded else 1
    needs = []
    local = local_path(checkpoints)
    if checkpoint and local is not None:
        needs.append(SpaceNeed(local, "a checkpoint", (params + max(optimizer_bytes, 2 * params)) * copies))
    if weights:
        needs.append(SpaceNeed(Path(run_dir), "the final weights", params * copies))
    return needs


def check_space(needs: Iterable[SpaceNeed]) -> None:
    """``NotEnoughSpaceError`` naming the folder, the bytes needed (with the margin) and the bytes free when a disk
    has less room than what goes onto it (needs on one disk added up); nothing when the space cannot be read."""
    by_disk: dict[int, list[SpaceNeed]] = {}
    for need in needs:
        by_disk.setdefault(_device(need.folder), []).append(need)
    for on_disk in by_disk.values():
        total = sum(need.bytes for need in on_disk)
        wanted = total + max(int(total * SPACE_MARGIN), SPACE_FLOOR)
        free = free_bytes(on_disk[0].folder)
        if free is None or free >= wanted:
            continue
        parts = ", ".join(f"{need.what} {_size(need.bytes)} in {need.folder}" for need in on_disk)
        raise NotEnoughSpaceError(
            f"Not enough disk space for this run's saves: {parts}; with a {SPACE_MARGIN:.0%} margin that is "
            f"{_size(wanted)}, and {_size(free)} is free there. Nothing was trained or written. Free some space "
            "(old runs, older checkpoints: --checkpoint.keep-last), or write somewhere else (--output.runs-dir, "
            "--checkpoint.dir), or save less (--output.no-save-weights, --checkpoint.no-at-end)."
        )


def _device(folder: Path) -> int:
    """The file system ``folder`` (or its nearest existing folder) is on."""
    for existing in (folder, *folder.parents):
        if existing.exists():
            return os.stat(existing).st_dev
    return -1


def _size(count: int) -> str:
    """``1.15 GiB (1,234,567,890 bytes)``."""
    return f"{count / 2**30:.2f} GiB ({count:,} bytes)"
