"""Checkpoint locations: a local folder or an fsspec URL, and the few file operations checkpoints need on both.

A location is a ``pathlib.Path`` (a plain local path) or a ``str`` URL with a scheme
(``gs://bucket/run/checkpoints``, ``memory://run``, ``file:///data/run``), opened through fsspec.
Local paths keep using ``pathlib`` and ``shutil`` (so they can be renamed and fsynced); URLs use the
fsspec filesystem of their scheme. ``gs://`` needs gcsfs (``pip install gcsfs`` or
``titanpod-checkpoint[gcs]``); nothing here imports it unless a ``gs://`` URL is opened.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from fsspec.core import url_to_fs

from titanpod.checkpoint.errors import CheckpointError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

Location = Path | str
"""A local folder or file (``Path``), or an fsspec URL (``str``)."""

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_url(location: str | Path) -> bool:
    """True for a string with a scheme (``gs://...``, ``memory://...``, ``file://...``); False for local paths."""
    return isinstance(location, str) and _URL.match(location) is not None


def url_scheme(location: str | Path) -> str:
    """The scheme of a URL (``gs`` for ``gs://bucket``); ``""`` for a local path."""
    match = _URL.match(location) if isinstance(location, str) else None
    return match.group(1).lower() if match else ""


def as_location(text: str | Path) -> Location:
    """``text`` as a location: a URL string (without a trailing ``/``) or a local ``Path``."""
    if is_url(text):
        stripped = str(text).rstrip("/")
        return str(text) if stripped.endswith(":") else stripped  # "memory://" stays whole
    return Path(text)


def join(location: Location, *names: str) -> Location:
    """``location / name / ...`` for either kind of location."""
    if not is_url(location):
        return Path(location).joinpath(*names)
    return "/".join([location.rstrip("/"), *names])


def base_name(location: Location) -> str:
    """The last component of ``location`` (``step-000010`` of ``gs://b/run/step-000010``)."""
    return posixpath.basename(location.rstrip("/")) if is_url(location) else Path(location).name


def parent(location: Location) -> Location:
    """The folder holding ``location``."""
    return location.rstrip("/").rsplit("/", 1)[0] if is_url(location) else Path(location).parent


def local_path(location: Location) -> Path | None:
    """The local path a location names: itself, the path of a ``file://`` URL, or ``None`` for remote URLs."""
    if not is_url(location):
        return Path(location)
    if url_scheme(location) == "file":
        return Path(location[len("file://") :])
    return None


def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem of ``url`` and the path it knows the URL by; a clear error when it cannot be opened."""
    scheme = url_scheme(url)
    if scheme in ("gs", "gcs"):
        _require_gcsfs(url)
    try:
        return url_to_fs(url)
    except ImportError as error:
        raise CheckpointError(
            f"Cannot open {url}: the fsspec filesystem for {scheme}:// is not installed ({error}). "
            "Install the package fsspec names above, or choose a local folder."
        ) from error
    except ValueError as error:
        raise CheckpointError(
            f"Cannot open {url}: fsspec knows no filesystem for {scheme}:// ({error}). "
            "Use a local path or a URL fsspec supports (gs://, memory://, file://, ...)."
        ) from error


def _require_gcsfs(url: str) -> None:
    """Raise a ``CheckpointError`` saying how to install gcsfs when it is missing (``gs://`` needs it)."""
    try:
        import gcsfs  # noqa: F401  (fsspec's gs:// filesystem; optional)
    except ImportError as error:
        raise CheckpointError(
            f"Cannot open {url}: Cloud Storage (gs://) needs gcsfs, which is not installed. "
            "Run `pip install gcsfs` (or install titanpod-checkpoint[gcs])."
        ) from error


def exists(location: Location) -> bool:
    """True when a file or folder is at ``location``."""
    if not is_url(location):
        return Path(location).exists()
    fs, path = filesystem(str(location))
    return fs.exists(path)


def is_file(location: Location) -> bool:
    """True when ``location`` is a file."""
    if not is_url(location):
        return Path(location).is_file()
    fs, path = filesystem(str(location))
    return fs.isfile(path)


def is_dir(location: Location) -> bool:
    """True when ``location`` is a folder (on an object store: a prefix that holds objects)."""
    if not is_url(location):
        return Path(location).is_dir()
    fs, path = filesystem(str(location))
    return fs.isdir(path)


def children(location: Location) -> list[Location]:
    """The entries directly inside the folder ``location`` (none when it does not exist), freshly listed."""
    if not is_url(location):
        local = Path(location)
        return sorted(local.iterdir()) if local.is_dir() else []
    fs, path = filesystem(str(location))
    fs.invalidate_cache(path)  # another process (another rank, an earlier run) may have written since
    if not fs.isdir(path):
        return []
    names = {posixpath.basename(entry.rstrip("/")) for entry in fs.ls(path, detail=False)}
    return [join(location, name) for name in sorted(names) if name]


def read_bytes(location: Location) -> bytes:
    """The contents of the file at ``location`` (``FileNotFoundError`` when it is not there)."""
    if not is_url(location):
        return Path(location).read_bytes()
    fs, path = filesystem(str(location))
    return fs.cat_file(path)


def write_bytes(location: Location, data: bytes) -> None:
    """Write ``data`` to the file at ``location``, replacing it (one object written whole on a store)."""
    if not is_url(location):
        Path(location).write_bytes(data)
        return
    fs, path = filesystem(str(location))
    fs.pipe_file(path, data)


def make_folder(location: Location) -> None:
    """Create the folder ``location`` and its parents (a no-op on stores without folders)."""
    if not is_url(location):
        Path(location).mkdir(parents=True, exist_ok=True)
        return
    fs, path = filesystem(str(location))
    fs.makedirs(path, exist_ok=True)


def file_sizes(folder: Location) -> dict[str, int]:
    """Every file under ``folder`` (recursively) by its ``/``-separated path relative to ``folder`` -> size in bytes."""
    if not is_url(folder):
        local = Path(folder)
        files = [path for path in sorted(local.rglob("*")) if path.is_file()]
        return {path.relative_to(local).as_posix(): path.stat().st_size for path in files}
    fs, path = filesystem(str(folder))
    fs.invalidate_cache(path)
    root = path.rstrip("/") + "/"
    found = fs.find(path, detail=True)
    return {
        name[len(root) :]: int(info["size"])
        for name, info in sorted(found.items())
        if info.get("type") == "file" and name.startswith(root)
    }


def is_link(location: Location) -> bool:
    """True when ``location`` is a symbolic link on a local disk (object stores have none)."""
    path = local_path(location)
    return path is not None and path.is_symlink()


def remove_tree(location: Location, first: str | None = None) -> None:
    """Delete the folder ``location`` and everything in it; ``first`` (a file name inside) is deleted before the rest.

    Deleting a folder on an object store is not one operation: removing a checkpoint's commit marker
    first means a deletion cut short leaves a folder readers ignore, never one they trust. A symbolic link is
    never followed: ``CheckpointError`` names it, and nothing where it points is deleted.
    """
    if is_link(location):
        raise CheckpointError(
            f"{location} is a symbolic link (to {os.readlink(str(local_path(location)))}); a run never deletes through "
            "a link. Remove the link itself if it is no longer needed."
        )
    if not is_url(location):
        if first is not None:
            Path(location, first).unlink(missing_ok=True)
        shutil.rmtree(location, ignore_errors=True)
        return
    fs, path = filesystem(str(location))
    if first is not None and fs.exists(f"{path.rstrip('/')}/{first}"):
        fs.rm_file(f"{path.rstrip('/')}/{first}")
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.invalidate_cache(path)


def move(source: Location, target: Location) -> None:
    """Move the folder ``source`` (and everything in it) to ``target`` in the same place: a rename locally,
    a copy then a delete on an object store (which has no rename)."""
    if not is_url(source):
        Path(source).rename(target)
        return
    fs, path = filesystem(str(source))
    _, target_path = filesystem(str(target))
    fs.mv(path, target_path, recursive=True)
    fs.invalidate_cache(path)
