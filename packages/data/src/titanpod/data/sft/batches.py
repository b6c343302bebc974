"""Supervised fine-tuning batches: tokenized examples (``titanpod.data.sft.records``) packed whole into
fixed-length rows, served as resumable batches.

Packing puts whole examples into rows of ``seq_len`` positions in a seeded order (an example never
spans two rows), pads the end of each row with the pad token under ``IGNORE_INDEX`` labels, and gives
every position a document id (0, 1, 2 ... per example in the row; the padding is one more document),
so document-masked attention keeps the examples apart. A batch is ``(tokens_BS, labels_BS,
document_ids_BS)``. Legend: B batch, S sequence, R rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from rich.markup import escape

from titanpod.data.positions import check_batch_index
from titanpod.data.sft.config import SFTDataConfig
from titanpod.data.sft.records import (
    SHOWN_SKIPS,
    ExampleSet,
    Record,
    SFTExample,
    check_covers,
    encode_records,
    read_jsonl_records,
    task_records,
)
from titanpod.data.sft.tokenizer import SFTTokenizer
from titanpod.data.sources import DataError
from titanpod.data.tasks import Task, get_task
from titanpod.models import IGNORE_INDEX


class PackedRows(NamedTuple):
    """Examples packed whole into rows; every tensor int64 [R, S]."""

    tokens_RS: torch.Tensor
    """Input ids; the pad id after a row's last example."""
    labels_RS: torch.Tensor
    """Next-token labels, ``IGNORE_INDEX`` on prompt positions and padding."""
    documents_RS: torch.Tensor
    """Per row, 0 for its first example, 1 for the next ...; its padding is one more."""


def pack_examples(examples: Sequence[SFTExample], order: Sequence[int], seq_len: int, pad_id: int) -> PackedRows:
    """Pack ``examples`` in ``order`` into rows of ``seq_len``: each row takes examples until the next does
    not fit, then is padded. Every example must be at most ``seq_len`` long."""
    tokens: list[list[int]] = []
    labels: list[list[int]] = []
    documents: list[list[int]] = []
    row_tokens: list[int] = []
    row_labels: list[int] = []
    row_documents: list[int] = []

    def close_row() -> None:
        pad = seq_len - len(row_tokens)
        next_document = row_documents[-1] + 1 if row_documents else 0
        tokens.append(row_tokens + [pad_id] * pad)
        labels.append(row_labels + [IGNORE_INDEX] * pad)
        documents.append(row_documents + [next_document] * pad)

    for index in order:
        example = examples[index]
        if len(example) > seq_len:
            raise ValueError(f"Example {index} takes {len(example)} positions, more than seq_len {seq_len}.")
        if len(row_tokens) + len(example) > seq_len:
            close_row()
            row_tokens, row_labels, row_documents = [], [], []
        document = row_documents[-1] + 1 if row_documents else 0
        row_tokens += example.inputs
        row_labels += example.labels
        row_documents += [document] * len(example)
    if row_tokens:
        close_row()
    if not tokens:
        empty = torch.zeros(0, seq_len, dtype=torch.int64)
        return PackedRows(empty, empty.clone(), empty.clone())
    return PackedRows(*(torch.tensor(rows, dtype=torch.int64) for rows in (tokens, labels, documents)))


class SFTBatches:
    """Endless batches of packed SFT rows, re-packed in a new seeded example order every epoch.

    Process ``rank`` of ``world_size`` takes its own slice of every global batch; rows left over at an
    epoch's end are dropped (their examples come again in other rows next epoch). ``state_dict`` holds
    the position, so a resumed run sees exactly the batches it would have seen.
    """

    def __init__(
        self,
        examples: Sequence[SFTExample],
        seq_len: int,
        batch_size: int,
        pad_id: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.examples, self.seq_len, self.batch_size, self.pad_id = list(examples), seq_len, batch_size, pad_id
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch, self.index = 0, 0
        self._pack()

    def _pack(self) -> None:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.examples), generator=generator).tolist()
        self.rows = pack_examples(self.examples, order, self.seq_len, self.pad_id)
        global_batch = self.batch_size * self.world_size
        self.batches_per_epoch = self.rows.tokens_RS.shape[0] // global_batch
        if self.batches_per_epoch == 0:
            raise DataError(
                f"{len(self.examples):,} examples pack into {self.rows.tokens_RS.shape[0]:,} rows of {self.seq_len} "
                f"tokens, fewer than one global batch of {global_batch}: use more examples (--data.train-examples), "
                "a shorter --data.seq-len or a smaller --data.batch-size."
            )

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.index == self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
            self._pack()
        start = (self.index * self.world_size + self.rank) * self.batch_size
        self.index += 1
        return tuple(rows[start : start + self.batch_size].clone() for rows in self.rows)  # type: ignore[return-value]

    def state_dict(self) -> dict[str, Any]:
        """Where the iterator stands (epoch, batch index), with what the position depends on."""
        return {
            "kind": "sft_packed",
            "seed": self.seed,
            "epoch": self.epoch,
            "index": self.index,
            "examples": len(self.examples),
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by ``state_dict``; an error when the data it was saved with differs, and
        ``DataPositionError`` for a batch index past its epoch."""
        if state.get("kind") != "sft_packed":
            raise ValueError(
                f"The saved data position is of a {state.get('kind', 'packed')} loader, not SFT examples: resume "
                "with the data settings the checkpoint was made with."
            )
        current = {"examples": len(self.examples), "seq_len": self.seq_len, "batch_size": self.batch_size}
        for name, value in current.items():
            if state.get(name) != value:
                raise ValueError(
                    f"The checkpoint's data had {name} {state.get(name)}, this run's has {value}: resume with the "
                    "data settings the checkpoint was made with."
                )
        self.seed, self.epoch = state["seed"], state["epoch"]
        self._pack()  # an epoch's rows, and so its batches, depend on its order
        check_batch_index(state["index"], self.batches_per_epoch)
        self.index = state["index"]

    def trained_tokens(self) -> int:
        """Labelled (response) positions in this epoch's rows."""
        return int((self.rows.labels_RS != IGNORE_INDEX).sum())


@dataclass
class SFTData:
    """This run's SFT data."""

    train: SFTBatches
    """Endless packed batches with ``state_dict`` / ``load_state_dict``."""
    task: Task | None
    """The built-in task trained on (``data.source task``), else ``None``."""
    skipped: list[str]
    """Why each skipped record was skipped."""
    description: str
    """One line for the run's start."""

    def describe(self) -> str:
        """One line for the run's start."""
        return self.description


@dataclass
class SFTRecords:
    """A run's records, read and tokenized: what does not depend on the data rank, so a run checks it before it
    reads any weights."""

    encoded: ExampleSet
    """The usable examples, and the records skipped."""
    task: Task | None
    """The built-in task (``data.source task``), else ``None``."""
    where: str
    """Words naming the records."""
    layout: str = ""
    """How the records are laid out, in words: chats through the chat template, or prompt/response pairs in
    ``data.format``."""


def record_layout(records: list[Record], format: str) -> str:
    """How ``records`` are laid out, in words (a record with ``messages`` is a chat, whatever ``data.format``)."""
    chats = sum(record.get("messages") is not None for record in records)
    pairs = f"prompt/response pairs, {format} format"
    if chats == len(records):
        return "chats through the chat template"
    return pairs if chats == 0 else f"{chats:,} chats through the chat template, {len(records) - chats:,} {pairs}"


def encode_sft_records(config: SFTDataConfig, tokenizer: SFTTokenizer, seed: int) -> SFTRecords:
    """Read or generate the records and tokenize them. Every problem with the data (an unknown task, unreadable
    files, a bad record, a chat record and no chat template, too little data) is raised here."""
    task = None
    if config.source == "task":
        task = get_task(config.task)
        check_covers(tokenizer, task)
        records, where = task_records(task, config.train_examples, seed), f"task {task.name} (train split)"
    else:
        records, where = read_jsonl_records(config)
    encoded = encode_records(records, tokenizer, config, where)
    return SFTRecords(encoded, task, where, record_layout(records, config.format))


def pack_sft_data(
    records: SFTRecords, config: SFTDataConfig, tokenizer: SFTTokenizer, seed: int, rank: int = 0, world: int = 1
) -> SFTData:
    """Pack tokenized ``records`` into batches for data rank ``rank`` of ``world``."""
    encoded, where = records.encoded, records.where
    batches = SFTBatches(encoded.examples, config.seq_len, config.batch_size, tokenizer.pad_id, seed, rank, world)
    rows = batches.rows.tokens_RS.shape[0]
    fill = sum(len(example) for example in encoded.examples) / max(rows * config.seq_len, 1)
    skipped = ""
    if encoded.skipped:
        shown = escape("; ".join(encoded.skipped[:SHOWN_SKIPS]))
        more = f" and {len(encoded.skipped) - SHOWN_SKIPS} more" if len(encoded.skipped) > SHOWN_SKIPS else ""
        skipped = f"; [bold yellow]skipped {len(encoded.skipped)} bad records[/]: {shown}{more}"
    description = (
        f"data: {escape(where)}, {len(encoded.examples):,} examples "
        f"({records.layout or config.format + ' format'}, "
        f"{tokenizer.vocab_size:,}-token tokenizer {tokenizer.spec}) -> {rows:,} rows of {config.seq_len} "
        f"({fill:.0%} filled, "
        f"{batches.trained_tokens():,} response tokens), {batches.batches_per_epoch:,} batches of {config.batch_size} "
        f"per epoch; loss on response tokens only, examples kept apart by document masking{skipped}"
    )
    return SFTData(batches, records.task, encoded.skipped, description)


def build_sft_data(config: SFTDataConfig, tokenizer: SFTTokenizer, seed: int, rank: int = 0, world: int = 1) -> SFTData:
    """Read or generate the records, tokenize, and pack them into batches for data rank ``rank`` of ``world``
    (``encode_sft_records`` then ``pack_sft_data``)."""
    return pack_sft_data(encode_sft_records(config, tokenizer, seed), config, tokenizer, seed, rank, world)
