"""The weight files an earlier write left in a folder, which a new write of the same kind supersedes."""

from __future__ import annotations

import contextlib
from pathlib import Path

from titanpod.checkpoint.safetensors_io import WeightFileNames, read_index


def previous_weight_files(names: WeightFileNames, folder: Path) -> list[str]:
    """The weight files under ``names`` in ``folder``: the single file, the index and the shards the index
    lists. A new write replaces them all, whatever its own shard count, so no stale index or shard is left
    to be read in place of the new files. Only plain file names are taken from an index."""
    found = [name for name in (names.single, names.index) if (folder / name).is_file()]
    if names.index in found:
        with contextlib.suppress(ValueError):  # an unreadable index: only the index itself is known to be ours
            found += sorted(name for name in read_index(folder / names.index) if Path(name).name == name)
    return found
