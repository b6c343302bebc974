"""Cheap checks of local data files that the ``datasets`` library reports badly: empty files, where in a file the
bytes stop being UTF-8 text, and the first line of a JSON lines file that is not JSON."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from collections.abc import Callable
from pathlib import Path
from typing import IO, NamedTuple

OPENERS: dict[str, Callable[..., IO[bytes]]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
"""How a compressed file (by its last suffix) is opened to read its text; other files are read as they are."""
PLAIN_TEXT = (".json", ".jsonl", ".txt")
"""Suffixes of files read as text (parquet is binary: its strings are checked by its reader)."""


class Undecodable(NamedTuple):
    """Where a file's bytes first fail to decode as UTF-8."""

    line: int
    """Line number, from 1."""
    column: int
    """Byte offset in that line, from 1."""
    byte: int
    """The first byte that does not decode."""

    def describe(self) -> str:
        """``line L, byte B: 0xNN is not UTF-8``."""
        return f"line {self.line}, byte {self.column}: 0x{self.byte:02x} is not UTF-8"


def empty_files(files: list[str]) -> list[str]:
    """The files of ``files`` that hold no bytes at all."""
    return [name for name in files if Path(name).stat().st_size == 0]


def first_undecodable(path: str) -> Undecodable | None:
    """The first place ``path`` (a text file, maybe gzip/bz2/xz compressed) is not UTF-8; ``None`` when it all
    decodes or is not a text file. Reads the file line by line, once."""
    name = Path(path)
    if not any(suffix in name.suffixes for suffix in PLAIN_TEXT):
        return None
    with OPENERS.get(name.suffix, open)(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                return Undecodable(number, error.start + 1, line[error.start])
    return None


SHOWN_CHARACTERS = 120
"""Characters of a bad line a message shows."""


class BadLine(NamedTuple):
    """The first line of a JSON lines file that does not parse."""

    line: int
    """Line number, from 1."""
    problem: str
    """What the JSON parser says of it."""
    text: str
    """The line, cut to ``SHOWN_CHARACTERS``."""

    def describe(self) -> str:
        """``line L is not a JSON record (problem): 'text'``."""
        return f"line {self.line} is not a JSON record ({self.problem}): {self.text!r}"


def first_bad_json_line(path: str) -> BadLine | None:
    """The first non-blank line of ``path`` (JSON lines, maybe compressed) that is not a JSON object; ``None`` when
    every line is one, or the file is one JSON document rather than lines (it starts with ``[``)."""
    name = Path(path)
    if not any(suffix in name.suffixes for suffix in (".json", ".jsonl")):
        return None
    with OPENERS.get(name.suffix, open)(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            if number == 1 and text.startswith("["):
                return None
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                return BadLine(number, error.msg, _cut(text))
            if not isinstance(record, dict):
                return BadLine(number, f"a {type(record).__name__}, not an object", _cut(text))
    return None


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARACTERS else text[:SHOWN_CHARACTERS] + "..."
