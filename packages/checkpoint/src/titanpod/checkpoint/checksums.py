"""SHA-256 of checkpoint files: taken as they are written (or read back once), kept in a manifest, checked on load.

A manifest maps a file's ``/``-separated path inside its folder to ``{"size": n, "sha256": hex}``
(``trainer.json``'s ``files`` for trainer state; ``checksums.json`` beside exported weights). Manifests
written before hashes existed hold the size alone (a plain int); those files are checked by size only.
A file that differs is named with both hashes, so a flipped byte stops a load instead of training on it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from titanpod.checkpoint.errors import CheckpointError
from titanpod.checkpoint.locations import Location, filesystem, is_url, join

CHECKSUMS_FILE = "checksums.json"
"""Beside exported weights: the size and SHA-256 of every weight file (and index) written there."""
CHUNK_BYTES = 8 * 2**20
"""Bytes read at a time when a file is hashed after writing."""

Manifest = Mapping[str, Any]
"""Path inside a folder -> ``{"size": n, "sha256": hex}`` (or a plain int size, from older manifests)."""

_verified: dict[tuple[str, int, int, int], str] = {}  # (path, inode, size, mtime_ns) -> sha256 found


def manifest_entry(size: int, sha256: str) -> dict[str, Any]:
    """One manifest entry."""
    return {"size": size, "sha256": sha256}


def entry_size(item: Any) -> int:
    """The size an entry records (an old entry is the size itself)."""
    return int(item["size"]) if isinstance(item, Mapping) else int(item)


def entry_sha256(item: Any) -> str | None:
    """The SHA-256 an entry records; ``None`` for an entry from before hashes (a plain int)."""
    return item.get("sha256") if isinstance(item, Mapping) else None


def file_sha256(location: Location) -> str:
    """The SHA-256 (hex) of the file at ``location``, a local path or an fsspec URL, read once in chunks."""
    if is_url(location):
        fs, path = filesystem(str(location))
        with fs.open(path, "rb") as handle:
            return _digest(handle)
    with Path(location).open("rb", buffering=0) as handle:
        return _digest(handle)


def _digest(handle: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := handle.read(CHUNK_BYTES):
        digest.update(chunk)
    return digest.hexdigest()


def manifest_of(folder: Location, sizes: Mapping[str, int], hashed: bool = True) -> dict[str, Any]:
    """The manifest of the files ``sizes`` lists under ``folder`` (path -> size): each file read back and
    hashed; with ``hashed=False`` sizes alone (the form of manifests before hashes)."""
    if not hashed:
        return dict(sizes)
    return {name: manifest_entry(size, file_sha256(join(folder, *name.split("/")))) for name, size in sizes.items()}


class HashingWriter:
    """A binary file being written that hashes every byte as it goes (no second read)."""

    def __init__(self, handle: BinaryIO) -> None:
        """Wrap ``handle``, open for writing at its start."""
        self.handle = handle
        """The file written to."""
        self.size = 0
        """Bytes written so far."""
        self._digest = hashlib.sha256()

    def write(self, data: bytes | memoryview) -> int:
        """Write ``data`` and hash it."""
        self._digest.update(data)
        written = self.handle.write(data)
        self.size += memoryview(data).nbytes
        return written

    @property
    def sha256(self) -> str:
        """The SHA-256 (hex) of everything written so far."""
        return self._digest.hexdigest()


def damage(
    folder: Location, manifest: Manifest, sizes: Mapping[str, int], names: Iterable[str] | None = None
) -> tuple[str, str] | None:
    """The first file of ``manifest`` that is not what it records, as ``(name, what is wrong)``, or ``None``.

    Every file's size is held against ``sizes`` (path -> size found under ``folder``); the files in ``names``
    (default: all) are hashed too where the manifest records a hash. Reading is in manifest order.
    """
    for name, item in manifest.items():
        found = sizes.get(name)
        if found != entry_size(item):
            state = "missing" if found is None else f"{found:,} bytes instead of {entry_size(item):,}"
            return name, f"is {state} (truncated or overwritten)"
    for name in manifest if names is None else names:
        expected = entry_sha256(manifest[name])
        if expected is None:
            continue
        actual = _checked_sha256(join(folder, *name.split("/")))
        if actual != expected:
            return name, f"has SHA-256 {actual}, the manifest says {expected} (flipped bytes or an overwrite)"
    return None


def _checked_sha256(location: Location) -> str:
    """``file_sha256``, remembered for a local file until it changes (size, inode or modification time), so a
    file opened several times in one load is read for its hash once."""
    if is_url(location):
        return file_sha256(location)
    stat = os.stat(location)
    key = (str(Path(location).resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _verified:
        _verified[key] = file_sha256(location)
    return _verified[key]


def forget_verified() -> None:
    """Forget the hashes remembered for files already checked in this process (the next check reads them)."""
    _verified.clear()


def write_weights_manifest(directory: Path, written: Mapping[str, Mapping[str, Any]]) -> None:
    """Record ``written`` (file name -> entry) in ``directory``'s ``checksums.json``, keeping entries of other
    files already recorded there."""
    path = directory / CHECKSUMS_FILE
    manifest = read_weights_manifest(directory) or {}
    manifest.update(written)
    body = {"format": 1, "algorithm": "sha256", "files": dict(sorted(manifest.items()))}
    path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")


def read_weights_manifest(directory: Path) -> dict[str, Any] | None:
    """The file entries of ``directory``'s ``checksums.json``; ``None`` when there is none (a folder written
    elsewhere, or before checksums)."""
    path = directory / CHECKSUMS_FILE
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"{path} is unreadable ({error}); it should list the size and SHA-256 of each weight file. "
            "Re-export the weights, or delete it to load them unchecked."
        ) from error
    return dict(files)


def verify_weight_files(directory: Path, names: Iterable[str]) -> None:
    """Check the weight files ``names`` of ``directory`` against its ``checksums.json`` (when it has one):
    ``CheckpointError`` naming the first that differs. Files it does not list pass."""
    manifest = read_weights_manifest(directory)
    if not manifest:
        return
    listed = {name: manifest[name] for name in names if name in manifest}
    sizes = {name: (directory / name).stat().st_size for name in listed if (directory / name).is_file()}
    problem = damage(directory, listed, sizes)
    if problem is not None:
        name, what = problem
        raise CheckpointError(
            f"The checkpoint {directory} is damaged: {name} {what}. Export the weights again or use another "
            f"copy (to load them unchecked, delete {CHECKSUMS_FILE})."
        )
