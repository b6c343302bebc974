"""Opening documents: local files and Hub datasets through the ``datasets`` library (imported lazily).

Every failure here is a ``DataError`` that names the path, file, dataset or column at fault.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from titanpod.data.config import FILE_SOURCES, DataConfig, closest
from titanpod.data.file_checks import SHOWN_CHARACTERS, empty_files, first_bad_json_line, first_undecodable

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset

EXTENSIONS = {"json": (".json", ".jsonl"), "jsonl": (".jsonl", ".json"), "parquet": (".parquet",), "text": (".txt",)}
"""File name extensions (before any compression suffix) taken from a directory, per source."""
BUILDERS = {"json": "json", "jsonl": "json", "parquet": "parquet", "text": "text"}
"""The ``datasets`` packaged builder that reads each file source."""
PROBE_LIMIT = 100
"""Files read one by one, at most, to find the one that does not parse."""


class DataError(ValueError):
    """The data cannot be read as configured; the message says what, where and what to do."""


def quiet_datasets() -> None:
    """No progress bars and no log lines from the ``datasets`` library: its errors reach the user as ours."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Drop even the error log lines ``datasets`` prints before raising (we re-raise them, shorter)."""
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def data_files(config: DataConfig) -> list[str]:
    """The local files ``data.path`` names (a file, a directory or a glob), sorted; an error if there are none,
    or if one of them is empty (0 bytes: most often a download or a copy that did not finish)."""
    found = _named_files(config)
    empty = empty_files(found)
    if empty:
        more = f" (and {len(empty) - 1} more empty files)" if len(empty) > 1 else ""
        raise DataError(
            f"The data file {empty[0]} is empty (0 bytes){more}: no documents to read. Remove it or fill it "
            "(a download or copy that did not finish?), or point data.path at other files."
        )
    return found


def _named_files(config: DataConfig) -> list[str]:
    """The files ``data.path`` names, sorted; an error if there are none."""
    path = str(config.path)
    if any(char in path for char in "*?["):
        found = sorted(name for name in glob.glob(path, recursive=True) if Path(name).is_file())
        if not found:
            raise DataError(f"data.path {path!r} matches no files; check the pattern (** matches subfolders).")
        return found
    target = Path(path)
    if target.is_file():
        return [str(target)]
    if target.is_dir():
        extensions = EXTENSIONS[config.source]
        found = sorted(
            str(name)
            for name in target.rglob("*")
            if name.is_file() and not name.name.startswith(".") and any(ext in name.suffixes for ext in extensions)
        )
        if not found:
            raise DataError(
                f"data.path {path!r} is a directory with no {' or '.join(extensions)} files for data.source "
                f"{config.source!r}; point data.path at the files (a glob such as {path}/*.ext works too)."
            )
        return found
    raise DataError(f"data.path {path!r} does not exist; give a file, a directory or a glob of {config.source} files.")


def first_line(error: BaseException) -> str:
    """``Type: first line of the message`` (library messages can run to pages)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else '(no message)'}"


def error_chain(error: BaseException) -> list[BaseException]:
    """The error and the errors it was raised from, outermost first."""
    chain: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def _probe(name: str, source: str) -> BaseException | None:
    """Read every row of one file; the error it raises, if any."""
    import datasets

    try:
        with silenced():
            for _ in datasets.load_dataset(BUILDERS[source], data_files=[name], split="train", streaming=True):
                pass
    except Exception as error:
        return error
    return None


def read_error(error: BaseException, files: list[str], source: str) -> DataError:
    """A ``DataError`` for data the ``datasets`` library could not parse, naming the file at fault.

    When the library's message names no file and there are several, they are read one by one
    (at most ``PROBE_LIMIT``) to find the first that fails. Bytes that are not UTF-8 are named by file,
    line and byte (``decode_error``).
    """
    messages = " ".join(str(item) for item in error_chain(error))
    named = [name for name in files if name in messages]
    if any(isinstance(item, UnicodeDecodeError) for item in error_chain(error)):
        undecodable = decode_error(named + [name for name in files if name not in named], source)
        if undecodable is not None:
            return undecodable
    where = named[0] if named else files[0] if len(files) == 1 else None
    if where is None:
        for name in files[:PROBE_LIMIT]:
            failure = _probe(name, source)
            if failure is not None:
                where, error = name, failure
                break
    if where is None:
        where = f"one of {len(files)} files ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})"
    elif source in ("json", "jsonl") and (bad := first_bad_json_line(where)) is not None:
        return DataError(
            f"Cannot read {where} as {source}: {bad.describe()}. Fix that line or delete it "
            f"(sed -i '{bad.line}d' {where}), then run again."
        )
    chain = error_chain(error)
    telling = next((item for item in chain if "An error occurred while generating" not in str(item)), chain[0])
    return DataError(f"Cannot read {where} as {source}: {first_line(telling)}")


def decode_error(files: list[str], source: str) -> DataError | None:
    """A ``DataError`` naming the first of ``files`` (at most ``PROBE_LIMIT``) that is not UTF-8, with the
    line and byte; ``None`` when they all decode."""
    for name in files[:PROBE_LIMIT]:
        found = first_undecodable(name)
        if found is not None:
            return DataError(
                f"Cannot read {name} as {source}: {found.describe()} text. Re-encode the file as UTF-8 "
                "(e.g. iconv -f latin1 -t utf-8), or remove the bad bytes."
            )
    return None


def check_text_field(columns: list[str] | None, config: DataConfig, where: str) -> None:
    """Refuse a ``data.text_field`` that is not one of the data's columns, suggesting the closest."""
    if columns is not None and config.text_field not in columns:
        raise DataError(
            f"data.text_field {config.text_field!r} is not a column of {where}; its columns are "
            f"{', '.join(columns)}.{closest(config.text_field, columns)} Set --data.text_field."
        )


def describe_source(config: DataConfig, files: list[str] | None = None) -> str:
    """A few words naming where the documents come from."""
    if config.source == "hub":
        return f"hub {config.path}{f' ({config.name})' if config.name else ''} split {config.split}"
    if files is not None and len(files) > 1:
        return f"{config.source} {config.path} ({len(files)} files)"
    return f"{config.source} {config.path}"


def load_local(config: DataConfig) -> tuple[Dataset, list[str]]:
    """Local files as one map-style dataset (converted to Arrow in the ``datasets`` cache), and the files read."""
    import datasets

    files = data_files(config)
    try:
        with silenced():
            table = datasets.load_dataset(BUILDERS[config.source], data_files={"train": files}, split=config.split)
    except Exception as error:  # the library raises many types (ArrowInvalid, DatasetGenerationError, ...)
        raise read_error(error, files, config.source) from error
    check_text_field(table.column_names, config, describe_source(config, files))
    return table, files


def open_stream(config: DataConfig, split: str) -> tuple[IterableDataset, list[str] | None]:
    """``split`` of the configured source as a streaming dataset whose first document has been read (so a
    file that does not parse, a network failure or a missing column is found now, before training)."""
    import datasets

    files = data_files(config) if config.source in FILE_SOURCES else None
    where = describe_source(config, files)
    try:
        with silenced():
            if files is not None:
                stream = datasets.load_dataset(
                    BUILDERS[config.source], data_files={"train": files}, split=split, streaming=True
                )
            else:
                stream = datasets.load_dataset(config.path, config.name, split=split, streaming=True)
            first = next(iter(stream), None)
    except Exception as error:
        if files is not None:
            raise read_error(error, files, config.source) from error
        raise DataError(
            f"Cannot stream the Hub dataset {config.path!r} (config {config.name!r}, split {split!r}): "
            f"{first_line(error)}. Check the id, data.name and the split, and the network (HF_HUB_OFFLINE unset); "
            "or download the files and read them locally with --data.source jsonl|parquet|text --data.path ..."
        ) from error
    if first is None:
        raise DataError(f"{where} holds no documents.")
    check_text_field(list(first), config, where)
    return stream, files


def as_text(
    value: Any,
    config: DataConfig,
    document: int | None = None,
    files: list[str] | None = None,
    record: Any = None,
) -> str:
    """One document's text, with an error naming the field, and where known the document (its index from 0 over
    ``files`` in order) and its ``record``, when it holds no string."""
    if isinstance(value, str):
        return value
    field = config.text_field
    if document is None:
        which = ""
    elif files is not None and len(files) == 1:
        which = f"record {document + 1} of {files[0]}"
    else:
        which = f"document {document + 1} of the {len(files or [])} files in order"
    shown = f": {json.dumps(record, default=str)[:SHOWN_CHARACTERS]}" if record is not None else ""
    if value is None and which:
        raise DataError(
            f"{which[:1].upper()}{which[1:]} has no {field!r} field{shown}. Give it one or delete it "
            "(--data.text-field names another field, if every record has it)."
        )
    raise DataError(
        f"data.text_field {field!r} holds {type(value).__name__} values{f' ({which}{shown})' if which else ''}, not "
        "text; name a field of strings with --data.text-field."
    )
