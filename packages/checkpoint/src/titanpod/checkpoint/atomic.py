"""Directories that appear complete or not at all, and never take other files with them.

A write goes into a hidden staging folder beside the target and moves into place when complete.
Into a new (or empty) target the staging folder is renamed. Into a folder that already holds
files, only with ``overwrite``: the files the write produces replace their namesakes, the files
``superseded`` names (a previous write of the same kind, e.g. the shards an old index lists) are
removed, and every other file stays. Nothing the write did not produce or supersede is deleted.

A write cut short by a kill leaves its staging folder (``.<name>.partial-<pid>``), and, when killed while
swapping a folder whole, the folder it set aside (``.<name>.replaced-<pid>``): ``remove_leftovers`` clears both.
A target that is a symbolic link to a folder is never swapped whole (that would set the link aside and delete
through it): the files are written into the folder it points to, as into a folder that holds other files.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from titanpod.checkpoint.disk_space import disk_full_cause, disk_full_error

Superseded = Callable[[Path], Iterable[str]]
"""Given the existing target folder, the names of files in it that a new write of this kind replaces."""

LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|replaced)-(?P<pid>\d+)$")
"""The name of a folder ``atomic_directory`` writes beside its target for a moment: staging or set aside."""


def check_target(final: Path, overwrite: bool) -> None:
    """Refuse a target that is a file, or a non-empty folder without ``overwrite``, before anything is written."""
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise NotADirectoryError(f"{final} is a file; the output must be a folder. Choose another output path.")
    if not overwrite and final.is_dir() and any(final.iterdir()):
        raise FileExistsError(
            f"{final} already exists and is not empty; write into a new or empty folder, or ask to overwrite "
            "(only the files this write produces are replaced; other files are kept)."
        )


@contextmanager
def atomic_directory(
    final: Path,
    *,
    overwrite: bool = True,
    superseded: Superseded | None = None,
    needed_bytes: int | None = None,
) -> Iterator[Path]:
    """Yield a hidden staging directory beside ``final``; move its files into ``final`` on success.

    Readers never see a half-written new ``final``. On an exception the staging directory is
    removed and ``final`` is left as it was; a full disk becomes a ``DiskFullError`` naming ``final``
    and ``needed_bytes`` (the size of the write, when known). An existing non-empty ``final`` is
    refused unless ``overwrite``; then only the files written and those ``superseded`` returns are
    replaced or removed (see the module docstring).
    """
    final = Path(final)
    check_target(final, overwrite)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.partial-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        yield staging
        for path in staging.iterdir():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
        _move_into_place(staging, final, superseded)
    except BaseException as error:
        full = None
        if needed_bytes is not None and disk_full_cause(error) is not None:
            full = disk_full_error(final, needed_bytes)  # before the cleanup frees what the write took
        shutil.rmtree(staging, ignore_errors=True)
        if full is not None:
            raise full from error
        raise


def _move_into_place(staging: Path, final: Path, superseded: Superseded | None) -> None:
    """Rename ``staging`` to ``final``, or, when ``final`` holds files, replace and remove only what is ours."""
    if not final.exists() or not any(final.iterdir()):
        if final.exists():
            final.rmdir()  # empty: nothing to keep
        staging.rename(final)
        return
    written = {path.name for path in staging.iterdir()}
    stale = {name for name in (superseded(final) if superseded else ()) if name not in written}
    existing = {path.name for path in final.iterdir()}
    if existing <= written | stale and not final.is_symlink():  # only what this write replaces: swap it whole
        aside = final.parent / f".{final.name}.replaced-{os.getpid()}"
        final.rename(aside)
        staging.rename(final)
        shutil.rmtree(aside)
        return
    folders = sorted(name for name in written | stale if (final / name).is_dir())
    if folders:
        raise IsADirectoryError(f"{final} holds folders named like files this write replaces: {', '.join(folders)}.")
    for name in stale:
        (final / name).unlink(missing_ok=True)
    for name in written:
        os.replace(staging / name, final / name)
    staging.rmdir()


def remove_leftovers(folder: Path) -> list[str]:
    """Clear what ``atomic_directory`` writes cut short by a kill left in ``folder``; a line per folder saying what
    was done.

    A staging folder (``.<name>.partial-<pid>``) is removed. A folder set aside while its target was swapped
    (``.<name>.replaced-<pid>``) is removed when ``<name>`` is there (the swap finished) and put back as ``<name>``
    when it is not (the kill came between the two renames), so the earlier folder is never lost. A leftover that
    is a symbolic link (a linked folder that was set aside) is put back the same way, and otherwise only unlinked:
    what it points to is never deleted. Call it only while no other process writes into
    ``folder`` (a run holds its run directory's lock).
    """
    said = []
    for path in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
        match = LEFTOVER.match(path.name)
        if match is None or not path.is_dir():
            continue
        target, kind, pid = path.parent / match.group("name"), match.group("kind"), match.group("pid")
        if path.is_symlink() and (kind == "partial" or os.path.lexists(target)):
            points_to = os.readlink(path)
            path.unlink()
            said.append(f"removed the link {path} to {points_to} left by process {pid}; what it points to is kept")
        elif kind == "replaced" and not target.exists():
            path.rename(target)
            said.append(f"put {path} back as {target}: its replacement was cut short (process {pid})")
        else:
            shutil.rmtree(path)
            what = "an unfinished write" if kind == "partial" else "the earlier copy of a finished replacement"
            said.append(f"removed {path}: {what} left by process {pid}")
    return said
