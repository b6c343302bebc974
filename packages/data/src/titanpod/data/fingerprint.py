"""What a run's local data files were when it read them: each file's size and a hash of its first MiB.

A checkpoint records it (``trainer.json``'s ``data_files``), and a resume compares it with the files as they are
now (``titanpod.runs.resume_check``), so a data file rewritten in place between two runs is named instead of read on
from the old position in other data. The hash covers a bounded prefix (``PREFIX_BYTES``), so a folder of large
shards is fingerprinted in moments; a rewrite that keeps a file's size and its first MiB goes unseen.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from titanpod.data.config import FILE_SOURCES, DataConfig
from titanpod.data.sources import data_files

PREFIX_BYTES = 1 << 20
"""How much of the start of each file is hashed."""


def file_fingerprint(path: Path) -> dict[str, Any]:
    """``{"size": bytes, "head_bytes": n, "head_sha256": hex}`` of the file ``path`` (the first ``n`` bytes hashed)."""
    with open(path, "rb") as handle:
        head = handle.read(PREFIX_BYTES)
        size = handle.seek(0, 2)
    return {"size": size, "head_bytes": len(head), "head_sha256": hashlib.sha256(head).hexdigest()}


def data_fingerprint(config: DataConfig) -> dict[str, dict[str, Any]]:
    """The fingerprint of every local file ``data.path`` names, by the name it is found under; ``{}`` for the
    builtin corpus, synthetic data and the Hub (no local file to change)."""
    if config.source not in FILE_SOURCES:
        return {}
    return {name: file_fingerprint(Path(name)) for name in data_files(config)}


def fingerprint_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """How the files of fingerprint ``current`` differ from those of ``saved``, a phrase a file (``[]``: none)."""
    changes = []
    for name in sorted(set(saved) | set(current)):
        before, after = saved.get(name), current.get(name)
        if after is None:
            changes.append(f"{name} is no longer found by data.path")
        elif before is None:
            changes.append(f"{name} is new: data.path did not find it then")
        elif before.get("size") != after["size"]:
            changes.append(f"{name} changed (size {before.get('size')} -> {after['size']} bytes)")
        elif before.get("head_sha256") != after["head_sha256"]:
            changes.append(f"{name} changed (its first {after['head_bytes']:,} bytes differ)")
    return changes
