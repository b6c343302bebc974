"""The data part of a run's config."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal, get_args

from titanpod.models.field_checks import check_field_types, expand_home, real_number, whole_number

TextSource = Literal["builtin", "synthetic", "json", "jsonl", "parquet", "text", "hub"]
"""What ``DataConfig.source`` accepts."""
FILE_SOURCES = ("json", "jsonl", "parquet", "text")
"""Sources read from local files through the ``datasets`` library."""
SOURCES: tuple[str, ...] = get_args(TextSource)
"""Every value ``DataConfig.source`` accepts."""


def closest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    """`` Did you mean 'x'?`` for the choice nearest ``word``, or an empty string."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" Did you mean {match[0]!r}?" if match else ""


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from and how they are cut into batches.

    ``synthetic`` needs no tokenizer; any ``validation_fraction`` above 0 gives it random validation batches.
    A ``shuffle_buffer`` is refilled on resume (the ``datasets`` library does not save it).
    """

    source: TextSource = "builtin"
    """builtin (shipped corpus), synthetic (random ids), local files (json, jsonl, parquet, text) or hub."""
    path: str | None = None
    """Local files: a file, a directory or a glob such as ``data/*.jsonl.gz``. ``hub``: a dataset id (allenai/c4)."""
    name: str | None = None
    """``hub`` only: the dataset's config name, e.g. ``en`` for allenai/c4."""
    split: str = "train"
    """The split to train on; local files are one split, ``train`` (map-style takes slices: ``train[:10%]``)."""
    text_field: str = "text"
    """The column holding each document's text (``text`` files: each line is a document)."""
    streaming: bool = False
    """Local files: tokenize while training and pack in order per rank, not all at start (``hub`` always streams)."""
    shuffle_buffer: int = 0
    """Streamed data: documents in the shuffle buffer, 0 reads in order (only then is a resume exact)."""
    tokenizer: str | None = None
    """``builtin``, a ``tokenizer.json`` path (or its directory), or a Hub model id such as meta-llama/Llama-3.1-8B.
    ``None``: the tokenizer of ``model.init_from`` when that folder has one, else ``builtin``."""
    tokenizer_revision: str | None = None
    """A Hub tokenizer's revision: a branch, tag or commit (``None``: the main branch); local paths ignore it."""
    seq_len: int = 256
    """Tokens per training sequence."""
    batch_size: int = 8
    """Sequences per batch on each process."""
    document_masking: bool = False
    """Tokens attend only within their document: batches add ``document_ids_BS``; cross-document labels are ignored."""
    validation_split: str | None = None
    """``hub``: the split held out for validation, e.g. ``validation`` (None: no validation)."""
    validation_fraction: float = 0.0
    """Local files and ``builtin``: the fraction of documents held out for validation, chosen by index (0: none)."""
    validation_batches: int = 8
    """Batches on each process per evaluation (at most this many for small map-style held-out data)."""
    validation_every: int = 0
    """Report the validation loss every this many steps, and after the last step (0: only after the last step,
    when data is held out)."""

    @property
    def is_streaming(self) -> bool:
        """Whether documents are read as a stream (``hub``, or local files with ``streaming``)."""
        return self.source == "hub" or (self.source in FILE_SOURCES and self.streaming)

    @property
    def has_validation(self) -> bool:
        """Whether any data is held out for validation."""
        return self.validation_split is not None or self.validation_fraction > 0

    def __post_init__(self) -> None:
        check_field_types(self, "data")
        expand_home(self, "path", "tokenizer")
        if self.source not in SOURCES:
            choices = ", ".join(SOURCES)
            raise ValueError(
                f"Unknown data.source {self.source!r}; choose one of {choices}.{closest(self.source, SOURCES)}"
            )
        if self.source in (*FILE_SOURCES, "hub") and not self.path:
            what = "a Hub dataset id such as allenai/c4" if self.source == "hub" else "a file, directory or glob"
            raise ValueError(f"data.source {self.source!r} needs data.path: {what}.")
        if self.source in ("builtin", "synthetic") and self.path is not None:
            raise ValueError(
                f"data.path is not read for data.source {self.source!r}; drop it, or set data.source to one of "
                f"{', '.join((*FILE_SOURCES, 'hub'))}."
            )
        if self.name is not None and self.source != "hub":
            raise ValueError(
                f"data.name (a Hub dataset config) is read only with data.source 'hub', not {self.source!r}."
            )
        if self.streaming and self.source not in FILE_SOURCES:
            raise ValueError(
                f"data.streaming applies to the local file sources ({', '.join(FILE_SOURCES)}); "
                f"data.source {self.source!r} is {'always streamed' if self.source == 'hub' else 'never streamed'}: "
                "drop data.streaming."
            )
        whole_number("data.shuffle_buffer", self.shuffle_buffer, at_least=0)
        if self.shuffle_buffer and not self.is_streaming:
            raise ValueError(
                "data.shuffle_buffer applies only to streamed data (data.source hub, or data.streaming True); "
                "map-style data is already shuffled by sequence every epoch: drop data.shuffle_buffer."
            )
        if not self.text_field:
            raise ValueError("data.text_field must name the column that holds the text, e.g. 'text'.")
        whole_number("data.seq_len", self.seq_len, at_least=2)
        whole_number("data.batch_size", self.batch_size, at_least=1)
        real_number("data.validation_fraction", self.validation_fraction, at_least=0, below=1)
        if self.validation_split is not None and self.source not in ("hub", "synthetic"):
            raise ValueError(
                f"data.validation_split names a split of a Hub dataset; for data.source {self.source!r} hold out "
                "documents with data.validation_fraction (e.g. 0.01) instead."
            )
        if self.validation_fraction > 0 and self.source == "hub":
            raise ValueError(
                "data.validation_fraction holds out documents of local data; for data.source 'hub' name a held-out "
                "split with data.validation_split (e.g. validation) instead."
            )
        whole_number("data.validation_every", self.validation_every, at_least=0)
        if self.validation_every and not self.has_validation:
            raise ValueError(
                "data.validation_every needs held-out data: set data.validation_fraction (e.g. 0.01) for local data, "
                "or data.validation_split (e.g. validation) for a Hub dataset."
            )
        whole_number("data.validation_batches", self.validation_batches, at_least=1)
