"""Content hashes of checkpoint files: taken as they are written (or read back once), kept in a manifest,
checked on load.

The hash is XXH3-128 (``xxhash``): it finds flipped bytes and overwrites as surely as a cryptographic
hash does (it is not meant to resist a forger, and neither is a manifest stored beside the files), at
several times SHA-256's speed, so checking costs a checkpoint little beside reading it.
A manifest maps a file's ``/``-separated path inside its folder to ``{"size": n, "xxh3_128": hex}``
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

import xxhash

from titanpod.checkpoint.errors import CheckpointError
from titanpod.checkpoint.locations import Location, filesystem, is_url, join

CHECKSUMS_FILE = "checksums.json"
"""Beside exported weights: the size and hash of every weight file (and index) written there."""
HASH = "xxh3_128"
"""The hash new manifests record (the entry's key); entries keyed ``sha256`` are still checked."""
_HASHES = {"xxh3_128": lambda: xxhash.xxh3_128(), "sha256": hashlib.sha256}
CHUNK_BYTES = 8 * 2**20
"""Bytes read at a time when a file is hashed after writing."""

Manifest = Mapping[str, Any]
"""Path inside a folder -> ``{"size": n, "xxh3_128": hex}`` (or a plain int size, from older manifests)."""


def manifest_entry(size: int, digest: str) -> dict[str, Any]:
    """One manifest entry: the file's size and its ``HASH`` (hex)."""
    return {"size": size, HASH: digest}


def digest_bytes(data: bytes) -> str:
    """The ``HASH`` (hex) of ``data``."""
    return xxhash.xxh3_128(data).hexdigest()


def entry_size(item: Any) -> int:
    """The size an entry records (an old entry is the size itself)."""
    return int(item["size"]) if isinstance(item, Mapping) else int(item)


def entry_hash(item: Any) -> tuple[str, str] | None:
    """``(hash name, hex)`` an entry records; ``None`` for an entry from before hashes (a plain int)."""
    if not isinstance(item, Mapping):
        return None
    for name in _HASHES:
        if name in item:
            return name, item[name]
    return None


def file_digest(location: Location, hash_name: str = HASH) -> str:
    """The ``hash_name`` (hex) of the file at ``location``, a local path or an fsspec URL, read once in chunks."""
    if is_url(location):
        fs, path = filesystem(str(location))
        with fs.open(path, "rb") as handle:
            return _digest(handle, hash_name)
    with Path(location).open("rb", buffering=0) as handle:
        return _digest(handle, hash_name)


def _digest(handle: BinaryIO, hash_name: str) -> str:
    digest = _HASHES[hash_name]()
    while chunk := handle.read(CHUNK_BYTES):
        digest.update(chunk)
    return digest.hexdigest()


def manifest_of(folder: Location, sizes: Mapping[str, int], hashed: bool = True) -> dict[str, Any]:
    """The manifest of the files ``sizes`` lists under ``folder`` (path -> size): each file read back and
    hashed; with ``hashed=False`` sizes alone (the form of manifests before hashes)."""
    if not hashed:
        return dict(sizes)
    return {name: manifest_entry(size, file_digest(join(folder, *name.split("/")))) for name, size in sizes.items()}


class HashingWriter:
    """A binary file being written that hashes every byte as it goes (no second read)."""

    def __init__(self, handle: BinaryIO) -> None:
        """Wrap ``handle``, open for writing at its start."""
        self.handle = handle
        """The file written to."""
        self.size = 0
        """Bytes written so far."""
        self._digest = xxhash.xxh3_128()

    def write(self, data: bytes | memoryview) -> int:
        """Write ``data`` and hash it."""
        self._digest.update(data)
        written = self.handle.write(data)
        self.size += memoryview(data).nbytes
        return written

    @property
    def digest(self) -> str:
        """The ``HASH`` (hex) of everything written so far."""
        return self._digest.hexdigest()


class VerifiedHashes:
    """Hashes of local files already read, each kept only while its file is unchanged: same device, inode, size,
    modification time and status-change time (which any write, rename or ``utime`` moves on, and nothing sets
    back), so a file replaced after it was checked is read again. An owner (a ``Checkpointer``) keeps one, so a
    file it checks several times is read once; nothing is shared across owners. Files at URLs are read every time.
    """

    def __init__(self) -> None:
        """Nothing remembered yet."""
        self._found: dict[tuple[Any, ...], str] = {}

    def digest(self, location: Location, hash_name: str) -> str:
        """``file_digest`` of ``location``, remembered while the file stays as it was when read."""
        if is_url(location):
            return file_digest(location, hash_name)
        key = self._key(location, hash_name)
        if key not in self._found:
            found = file_digest(location, hash_name)
            if self._key(location, hash_name) == key:  # unchanged while it was read: worth remembering
                self._found[key] = found
            return found
        return self._found[key]

    def forget(self) -> None:
        """Forget every hash remembered (the next check reads each file again)."""
        self._found.clear()

    @staticmethod
    def _key(location: Location, hash_name: str) -> tuple[Any, ...]:
        stat = os.stat(location)
        place = (str(Path(location).resolve()), stat.st_dev, stat.st_ino)
        return (hash_name, *place, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def damage(
    folder: Location,
    manifest: Manifest,
    sizes: Mapping[str, int],
    names: Iterable[str] | None = None,
    verified: VerifiedHashes | None = None,
) -> tuple[str, str] | None:
    """The first file of ``manifest`` that is not what it records, as ``(name, what is wrong)``, or ``None``.

    Every file's size is held against ``sizes`` (path -> size found under ``folder``); the files in ``names``
    (default: all) are hashed too where the manifest records a hash: read afresh, or through ``verified`` (hashes
    its owner already took, of files unchanged since). Reading is in manifest order.
    """
    for name, item in manifest.items():
        found = sizes.get(name)
        if found != entry_size(item):
            state = "missing" if found is None else f"{found:,} bytes instead of {entry_size(item):,}"
            return name, f"is {state} (truncated or overwritten)"
    for name in manifest if names is None else names:
        recorded = entry_hash(manifest[name])
        if recorded is None:
            continue
        hash_name, expected = recorded
        location = join(folder, *name.split("/"))
        actual = file_digest(location, hash_name) if verified is None else verified.digest(location, hash_name)
        if actual != expected:
            return name, f"has {hash_name} {actual}, the manifest says {expected} (flipped bytes or an overwrite)"
    return None


def write_weights_manifest(directory: Path, written: Mapping[str, Mapping[str, Any]]) -> None:
    """Record ``written`` (file name -> entry) in ``directory``'s ``checksums.json``, keeping entries of other
    files already recorded there."""
    path = directory / CHECKSUMS_FILE
    manifest = read_weights_manifest(directory) or {}
    manifest.update(written)
    body = {"format": 1, "algorithm": HASH, "files": dict(sorted(manifest.items()))}
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
            f"{path} is unreadable ({error}); it should list the size and hash of each weight file. "
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
