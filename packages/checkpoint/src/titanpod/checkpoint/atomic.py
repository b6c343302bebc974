"""Directories that appear complete or not at all."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a hidden staging directory beside ``final``; rename it to ``final`` on success.

    Readers never see a half-written ``final``. On an exception the staging directory is
    removed and ``final`` is left as it was. An existing ``final`` is replaced.
    """
    final = Path(final)
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
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
