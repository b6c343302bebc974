"""The rows of a run's ``metrics.jsonl``: strict JSON out, floats back in, and one history per run.

JSON has no NaN or Infinity (Python writes them as bare ``NaN``, which strict parsers refuse), so a row is
written with each NaN or Inf figure as ``null`` and a ``"nonfinite"`` object naming those fields and what they
held: ``{"step": 7, "loss": null, ..., "nonfinite": {"loss": "nan"}}`` (values ``"nan"``, ``"inf"``,
``"-inf"``, which ``float()`` reads back; a field inside a list or object is named by its path, ``a.0.b``).
``read_row`` gives the floats back.

A run that resumes from a checkpoint older than its last row (it went on past its last save before it
stopped) would append a second row for the same steps; ``set_aside_rows_after`` moves the rows past the
resumed step into a file beside it first, so ``metrics.jsonl`` holds one row per step of the history the
weights followed.

A file the run cannot take back as its own (not UTF-8 text, a symbolic link, not a plain file) is set aside
whole by ``set_aside_unreadable`` rather than read or appended to, and readers decode what is left of a damaged
line as a line cut short: a damaged metrics file never stops a run.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NONFINITE_KEY = "nonfinite"
"""The key of a row that names its NaN and Inf fields, each written as ``null``."""


def strict_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with every NaN or Inf float (at any depth) as ``None``, and, when there was one, ``"nonfinite"``
    mapping each such field (a dotted path inside lists and objects) to ``"nan"``, ``"inf"`` or ``"-inf"``."""
    found: dict[str, str] = {}
    out = {name: _finite(value, name, found) for name, value in row.items()}
    if found:
        out[NONFINITE_KEY] = found
    return out


def encode_row(row: Mapping[str, Any]) -> str:
    """``row`` as one line of strict JSON (``strict_row``), without the newline."""
    return json.dumps(strict_row(row), allow_nan=False)


def read_row(line: str) -> dict[str, Any] | None:
    """One line of ``metrics.jsonl`` as a dict, the fields ``"nonfinite"`` names as the floats they were (the
    key itself removed); ``None`` for a line that is no JSON object (one cut short by a killed run). Lines
    written before rows were strict (bare ``NaN``) read as well."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(row, dict):
        return None
    nonfinite = row.pop(NONFINITE_KEY, None)
    if isinstance(nonfinite, dict):
        for path, text in nonfinite.items():
            _put(row, str(path).split("."), float(text))
    return row


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of the metrics file ``path`` (``read_row``), lines cut short left out; ``[]`` when there is no file."""
    if not path.is_file():
        return []
    rows = (read_row(line) for line in _text(path).splitlines())
    return [row for row in rows if row is not None]


def set_aside_rows_after(path: Path, step: int) -> Path | None:
    """Move the lines of ``path`` past ``step`` into ``<stem>-after-step-<step>-<time>.jsonl`` beside it.

    Kept are the rows whose ``step`` is ``step`` or less; set aside are rows of later steps, lines cut short
    and rows without a step, in their order and as they were written. The file set aside is written (and
    synced) before ``path`` is replaced by its kept lines, so a crash in between loses no row. Returns the
    new file, or ``None`` when nothing was past ``step`` (``path`` is then left untouched).
    """
    if not path.is_file():
        return None
    kept: list[str] = []
    later: list[str] = []
    for line in _text(path).splitlines(keepends=True):
        row = read_row(line)
        row_step = None if row is None else row.get("step")
        keep = isinstance(row_step, int) and not isinstance(row_step, bool) and row_step <= step
        (kept if keep else later).append(line if line.endswith("\n") else line + "\n")
    if not later:
        return None
    aside = _free_name(path, f"{path.stem}-after-step-{step}-{time.strftime('%Y%m%d-%H%M%S')}")
    _write_synced(aside, later)
    staging = path.with_name(f".{path.name}.kept")
    _write_synced(staging, kept)
    os.replace(staging, path)
    return aside


def set_aside_unreadable(path: Path) -> tuple[Path, str] | None:
    """Move ``path`` whole to ``<stem>-damaged-<time>.jsonl`` beside it when the run cannot take it back as its own
    metrics: not UTF-8 text, a symbolic link (moved, never followed) or not a plain file. Returns where it went and
    why, or ``None`` when it is fine or absent."""
    why = _unreadable(path)
    if why is None:
        return None
    aside = _free_name(path, f"{path.stem}-damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    os.rename(path, aside)
    return aside, why


def _unreadable(path: Path) -> str | None:
    """Why ``path`` cannot be read back as metrics rows; ``None`` when it can (or is not there)."""
    if path.is_symlink():
        return "it is a symbolic link"
    if not path.exists():
        return None
    if not path.is_file():
        return "it is not a plain file"
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        return f"it is not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start})"
    return None


def _text(path: Path) -> str:
    """The text of ``path``; bytes that are not UTF-8 read as U+FFFD, which spoils only their line's JSON."""
    return path.read_bytes().decode("utf-8", errors="replace")


def _finite(value: Any, name: str, found: dict[str, str]) -> Any:
    """``value`` with NaN and Inf floats as ``None``, each recorded in ``found`` under its path."""
    if isinstance(value, float) and not math.isfinite(value):
        found[name] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return None
    if isinstance(value, Mapping):
        return {key: _finite(item, f"{name}.{key}", found) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item, f"{name}.{index}", found) for index, item in enumerate(value)]
    return value


def _put(row: dict[str, Any], path: list[str], value: float) -> None:
    """Set the field at ``path`` (keys of objects, indices of lists) in ``row`` to ``value``, where it exists."""
    *parents, last = path
    holder: Any = row
    for key in parents:
        holder = _child(holder, key)
    if isinstance(holder, dict) and last in holder:
        holder[last] = value
    elif isinstance(holder, list) and last.isdigit() and int(last) < len(holder):
        holder[int(last)] = value


def _child(holder: Any, key: str) -> Any:
    """``holder[key]`` of an object, or of a list at index ``key``; ``None`` where there is none."""
    if isinstance(holder, dict):
        return holder.get(key)
    if isinstance(holder, list) and key.isdigit() and int(key) < len(holder):
        return holder[int(key)]
    return None


def _free_name(path: Path, stem: str) -> Path:
    """``<stem>.jsonl`` beside ``path``, or ``<stem>-2.jsonl`` ... when that is taken."""
    candidate, number = path.with_name(f"{stem}{path.suffix}"), 1
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{stem}-{number}{path.suffix}")
    return candidate


def _write_synced(path: Path, lines: list[str]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        handle.writelines(lines)
        handle.flush()
        os.fsync(handle.fileno())
