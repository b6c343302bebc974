"""The one entry point from a ``DataConfig`` to this process's training and validation batches.

A batch is ``(tokens_BS, labels_BS)`` of int64 [batch_size, seq_len], or with document masking
``(tokens_BS, labels_BS, document_ids_BS)``. Legend: B batch, S sequence.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from tokenizers import Tokenizer

from titanpod.data.config import DataConfig
from titanpod.data.packing import PackedBatches, PackedStream, is_held_out, tokenize_documents
from titanpod.data.rank_state import gather_rank_states
from titanpod.data.shipped import builtin_corpus_path
from titanpod.data.sources import (
    DataError,
    as_text,
    decode_error,
    describe_source,
    load_local,
    open_stream,
    quiet_datasets,
    read_error,
)
from titanpod.data.streaming import StreamingBatches
from titanpod.data.synthetic import SyntheticBatches
from titanpod.data.tokenizer import BUILTIN, check_fits, end_of_text_id, resolve_tokenizer

if TYPE_CHECKING:
    from datasets import IterableDataset

Batch = tuple[torch.Tensor, ...]
"""``(tokens_BS, labels_BS)`` or ``(tokens_BS, labels_BS, document_ids_BS)``."""
TOKENIZE_CHUNK = 1024
"""Documents tokenized together when map-style data is read."""


class TrainBatches(Protocol):
    """What ``TrainData.train`` is: an endless iterator of batches whose position can be saved and restored."""

    batches_per_epoch: int | None

    def __next__(self) -> Batch: ...

    def __iter__(self) -> Iterator[Batch]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ValidationBatches:
    """The same fixed list of validation batches on every pass, so validation losses compare across evaluations."""

    def __init__(self, batches: list[Batch], description: str) -> None:
        self.batches, self.description = batches, description

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def __call__(self) -> list[Batch]:
        return list(self.batches)


@dataclass
class TrainData:
    """This process's data: training batches, optional validation batches, and a line that describes them."""

    train: TrainBatches
    """Endless training batches with ``state_dict`` / ``load_state_dict`` (save it in checkpoints)."""
    validation: ValidationBatches | None
    """A fixed list of validation batches (iterate it or call it), or ``None`` without held-out data."""
    description: str
    """One line for the run's start: source, tokens, sequences, batches, validation, masking."""

    def describe(self) -> str:
        """One line for the run's start."""
        return self.description


def build_data(config: DataConfig, vocab_size: int, seed: int, rank: int, world_size: int) -> TrainData:
    """Open, tokenize, pack and shard the configured data for process ``rank`` of ``world_size``.

    Every problem with the configuration or the data (missing files, unparsable files, a missing
    column, a tokenizer too large for the model, too little data) is raised here, before training.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of the {world_size} data-parallel ranks.")
    if config.source == "synthetic":
        return _synthetic(config, vocab_size, seed, rank)
    spec = _spec(config)
    tokenizer = resolve_tokenizer(spec, config.tokenizer_revision)
    check_fits(tokenizer, spec, vocab_size)
    if config.is_streaming:
        return _streamed(config, tokenizer, seed, rank, world_size)
    return _map_style(config, tokenizer, seed, rank, world_size)


def _spec(config: DataConfig) -> str:
    return config.tokenizer or BUILTIN  # None: a run without init_from's tokenizer has the built-in one


def _masking(config: DataConfig) -> str:
    return "; document masking" if config.document_masking else ""


def _synthetic(config: DataConfig, vocab_size: int, seed: int, rank: int) -> TrainData:
    train = SyntheticBatches(vocab_size, config.seq_len, config.batch_size, seed, rank, config.document_masking)
    validation = None
    if config.has_validation:
        batches = train.validation_batches(config.validation_batches)
        validation = ValidationBatches(batches, f"{len(batches)} random batches")
    description = (
        f"data: synthetic, uniform random ids below {vocab_size:,}, {config.batch_size} x {config.seq_len} tokens "
        f"per batch per rank; validation: {validation.description if validation else 'none'}{_masking(config)}"
    )
    return TrainData(train, validation, description)


def _document_chunks(config: DataConfig) -> tuple[Iterator[list[str]], str]:
    """The configured map-style documents, in chunks, and the words describing where they come from."""
    if config.source == "builtin":
        documents = builtin_corpus_path().read_text(encoding="utf-8").split("\n\n")
        chunks = (documents[i : i + TOKENIZE_CHUNK] for i in range(0, len(documents), TOKENIZE_CHUNK))
        return chunks, "builtin corpus"
    quiet_datasets()
    table, files = load_local(config)
    text = table.select_columns([config.text_field])

    def texts(start: int, values: list[Any]) -> list[str]:
        return [
            value if isinstance(value, str) else as_text(value, config, start + row, files, table[start + row])
            for row, value in enumerate(values)
        ]

    starts = range(0, len(text), TOKENIZE_CHUNK)
    batches = text.iter(batch_size=TOKENIZE_CHUNK)
    chunks = (texts(start, batch[config.text_field]) for start, batch in zip(starts, batches, strict=False))
    return decoded(chunks, files, config.source), describe_source(config, files)


def decoded(chunks: Iterator[list[str]], files: list[str], source: str) -> Iterator[list[str]]:
    """``chunks`` as they come; bytes that are not UTF-8 (found only as the table's strings are read) become a
    ``DataError`` naming the file, line and byte."""
    try:
        yield from chunks
    except UnicodeDecodeError as error:
        raise (decode_error(files, source) or read_error(error, files, source)) from error


def _packed(stream: PackedStream, config: DataConfig, seed: int, rank: int, world_size: int) -> PackedBatches:
    ends = stream.ends_D if config.document_masking else None
    return PackedBatches(stream.tokens_N, config.seq_len, config.batch_size, seed, rank, world_size, ends)


def _map_style(config: DataConfig, tokenizer: Tokenizer, seed: int, rank: int, world_size: int) -> TrainData:
    chunks, where = _document_chunks(config)
    separator = end_of_text_id(tokenizer)
    train_stream, held_out = tokenize_documents(chunks, tokenizer, separator, config.validation_fraction)
    try:
        train = _packed(train_stream, config, seed, rank, world_size)
    except ValueError as error:
        raise DataError(f"{where}: {error}") from error
    validation = None
    if config.validation_fraction > 0:
        try:
            source = _packed(held_out, config, seed, rank, world_size)
        except ValueError as error:
            raise DataError(
                f"The held-out validation data ({config.validation_fraction:g} of the documents: "
                f"{len(held_out.ends_D):,} documents, {held_out.tokens_N.numel():,} tokens) is too small: {error} "
                "Or raise data.validation_fraction."
            ) from error
        count = min(config.validation_batches, source.batches_per_epoch)
        validation = ValidationBatches(
            [next(source) for _ in range(count)],
            f"{count} batches from {len(held_out.ends_D):,} held-out documents ({config.validation_fraction:g})",
        )
    description = (
        f"data: {where}, {len(train_stream.ends_D):,} documents, {train_stream.tokens_N.numel():,} tokens "
        f"({tokenizer.get_vocab_size():,}-token tokenizer {_spec(config)}) -> {train.windows_WS.shape[0]:,} "
        f"sequences of {config.seq_len}, {train.batches_per_epoch:,} batches of {config.batch_size} per epoch on each "
        f"of {world_size} rank(s); validation: {validation.description if validation else 'none'}{_masking(config)}"
    )
    return TrainData(train, validation, description)


def _streamed(config: DataConfig, tokenizer: Tokenizer, seed: int, rank: int, world_size: int) -> TrainData:
    from datasets.distributed import split_dataset_by_node

    quiet_datasets()
    base, files = open_stream(config, config.split)
    fraction, field = config.validation_fraction, config.text_field

    def shard(dataset: IterableDataset) -> IterableDataset:
        return split_dataset_by_node(dataset, rank, world_size) if world_size > 1 else dataset

    def open_train() -> IterableDataset:
        dataset = base.select_columns([field])
        if fraction > 0:
            dataset = dataset.filter(lambda _, index: not is_held_out(index, fraction), with_indices=True)
        if config.shuffle_buffer:
            dataset = dataset.shuffle(seed=seed, buffer_size=config.shuffle_buffer)
        return shard(dataset)

    def encode(texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]

    def batches(open_dataset: Any, repeat: bool) -> StreamingBatches:
        return StreamingBatches(
            open_dataset,
            encode,
            lambda example: as_text(example[field], config),
            end_of_text_id(tokenizer),
            config.seq_len,
            config.batch_size,
            rank,
            world_size,
            config.document_masking,
            repeat,
            explain=(lambda error: read_error(error, files, config.source)) if files else None,
        )

    validation = None
    if config.has_validation:
        if config.validation_split is not None:
            held, _ = open_stream(config, config.validation_split)
            what = f"split {config.validation_split}"

            def open_validation() -> IterableDataset:
                return shard(held.select_columns([field]))
        else:
            what = f"{fraction:g} of the documents held out"

            def open_validation() -> IterableDataset:
                kept = base.select_columns([field])
                return shard(kept.filter(lambda _, index: is_held_out(index, fraction), with_indices=True))

        validation_list = list(itertools.islice(batches(open_validation, False), config.validation_batches))
        got = len(validation_list)
        if got < config.validation_batches:
            more = " or raise data.validation_fraction" if fraction else ""
            fix = f"lower data.validation_batches to {got}{more}" if got else f"use smaller batches{more}"
            raise DataError(
                f"The validation data ({what}) gives rank {rank} of {world_size} only {got} batches of "
                f"{config.batch_size} x {config.seq_len} tokens; {fix}."
            )
        validation = ValidationBatches(validation_list, f"{len(validation_list)} batches from {what}")
    shuffle = f"shuffle buffer {config.shuffle_buffer:,}" if config.shuffle_buffer else "in order"
    description = (
        f"data: {describe_source(config, files)}, streamed {shuffle} ({tokenizer.get_vocab_size():,}-token tokenizer "
        f"{_spec(config)}), rank {rank} of {world_size} packs its own shard into batches of {config.batch_size} x "
        f"{config.seq_len}; validation: {validation.description if validation else 'none'}{_masking(config)}"
    )
    return TrainData(batches(open_train, True), validation, description)


def gather_data_state(train: TrainBatches) -> dict[str, Any]:
    """The data position to save in a checkpoint, from every rank: a collective when torch.distributed runs.

    Map-style and synthetic positions are the same on every rank, so this is ``train.state_dict()``.
    A streamed dataset's position differs per rank: it returns ``{"per_rank": [state of data rank 0, ...]}``,
    which ``load_state_dict`` on each rank understands. Call it on every rank.
    """
    return gather_rank_states(train.state_dict(), "streaming", "gather_data_state")
