"""Packing documents into fixed-length sequences and serving them as batches (map-style data).

Legend: B batch, S sequence, N tokens in the stream, D documents, W windows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
from tokenizers import Tokenizer

from titanpod.data.positions import check_batch_index
from titanpod.models import IGNORE_INDEX


def pack_documents(documents: Iterable[str], tokenizer: Tokenizer, separator_id: int) -> torch.Tensor:
    """Tokenize ``documents`` and concatenate them, each followed by ``separator_id`` (int64 [N])."""
    encodings = tokenizer.encode_batch(list(documents), add_special_tokens=False)
    stream: list[int] = []
    for encoding in encodings:
        stream.extend(encoding.ids)
        stream.append(separator_id)
    return torch.tensor(stream, dtype=torch.int64)


class PackedStream(NamedTuple):
    """Documents tokenized and concatenated, each followed by the separator."""

    tokens_N: torch.Tensor
    """The token stream (int32, to halve the memory of large data; batches are int64)."""
    ends_D: torch.Tensor
    """The position of each document's separator in ``tokens_N`` (int64, increasing)."""


def is_held_out(index: int, fraction: float) -> bool:
    """Whether document ``index`` is held out for validation: ``fraction`` of documents, evenly spread."""
    return fraction > 0 and math.floor((index + 1) * fraction) > math.floor(index * fraction)


class _StreamBuilder:
    def __init__(self) -> None:
        self.parts: list[torch.Tensor] = []
        self.lengths: list[int] = []

    def add(self, encoded: list[list[int]], separator_id: int) -> None:
        flat: list[int] = []
        for ids in encoded:
            flat.extend(ids)
            flat.append(separator_id)
            self.lengths.append(len(ids) + 1)
        self.parts.append(torch.tensor(flat, dtype=torch.int32))

    def build(self) -> PackedStream:
        tokens_N = torch.cat(self.parts) if self.parts else torch.zeros(0, dtype=torch.int32)
        return PackedStream(tokens_N, torch.tensor(self.lengths, dtype=torch.int64).cumsum(0) - 1)


def tokenize_documents(
    chunks: Iterable[list[str]], tokenizer: Tokenizer, separator_id: int, hold_out: float = 0.0
) -> tuple[PackedStream, PackedStream]:
    """Tokenize documents arriving in chunks into a training stream and a held-out stream.

    Document ``i`` (counting over all chunks) goes to the held-out stream when ``is_held_out(i, hold_out)``.
    Chunks bound the memory of the Python lists of ids; the streams themselves are int32 tensors.
    """
    train, held_out = _StreamBuilder(), _StreamBuilder()
    index = 0
    for texts in chunks:
        encoded = [encoding.ids for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]
        flags = [is_held_out(index + offset, hold_out) for offset in range(len(texts))]
        index += len(texts)
        train.add([ids for ids, out in zip(encoded, flags, strict=True) if not out], separator_id)
        held_out.add([ids for ids, out in zip(encoded, flags, strict=True) if out], separator_id)
    return train.build(), held_out.build()


def mask_documents(
    window_BS1: torch.Tensor, documents_BS1: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, labels and document ids (from 0 in each row) of windows of ``S + 1`` tokens whose absolute
    document numbers are ``documents_BS1``; a label in another document than its input is ``IGNORE_INDEX``."""
    relative_BS1 = documents_BS1 - documents_BS1[:, :1]
    labels_BS = window_BS1[:, 1:].clone()
    labels_BS[relative_BS1[:, 1:] != relative_BS1[:, :-1]] = IGNORE_INDEX
    return window_BS1[:, :-1].contiguous(), labels_BS, relative_BS1[:, :-1].contiguous()


class PackedBatches:
    """Batches of next-token windows cut from one token stream, reshuffled every epoch.

    The stream is split into non-overlapping windows of ``seq_len + 1`` tokens, each giving
    ``seq_len`` inputs and the ``seq_len`` labels shifted by one. Window order is a seeded
    permutation per epoch; process ``rank`` of ``world_size`` takes its own slice of every
    global batch. ``state_dict`` holds the position, so a resumed run sees the same batches.

    With ``document_ends`` (the position of each document's separator), batches are
    ``(tokens_BS, labels_BS, document_ids_BS)`` and labels across a document boundary are ignored.
    """

    def __init__(
        self,
        tokens_N: torch.Tensor,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        document_ends: torch.Tensor | None = None,
    ) -> None:
        n_windows = (tokens_N.numel() - 1) // seq_len
        global_batch = batch_size * world_size
        if n_windows < global_batch:
            raise ValueError(
                f"The data has {tokens_N.numel():,} tokens: {max(n_windows, 0)} sequences of {seq_len}, fewer than "
                f"one global batch of {global_batch}. Use more data, a shorter data.seq_len or a smaller "
                "data.batch_size."
            )
        self.windows_WS = tokens_N[: n_windows * seq_len + 1].unfold(0, seq_len + 1, seq_len)
        self.seq_len, self.document_ends = seq_len, document_ends
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.batches_per_epoch = n_windows // global_batch
        self.epoch, self.index = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.windows_WS.shape[0], generator=generator)

    def __iter__(self) -> PackedBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, ...]:
        if self.index == self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
            self._order = self._permutation()
        start = (self.index * self.world_size + self.rank) * self.batch_size
        chosen_B = self._order[start : start + self.batch_size]
        window_BS1 = self.windows_WS[chosen_B].to(torch.int64)
        self.index += 1
        if self.document_ends is None:
            return window_BS1[:, :-1].contiguous(), window_BS1[:, 1:].contiguous()
        positions_BS1 = chosen_B[:, None] * self.seq_len + torch.arange(self.seq_len + 1)
        return mask_documents(window_BS1, torch.searchsorted(self.document_ends, positions_BS1))

    def state_dict(self) -> dict[str, Any]:
        """Where the iterator stands: epoch and batch index within it (and the seed of the window order)."""
        return {"kind": "packed", "epoch": self.epoch, "index": self.index, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by ``state_dict``; ``DataPositionError`` for a batch index past an epoch."""
        kind = state.get("kind", "packed")
        if kind != "packed":
            raise ValueError(
                f"The saved data position is of a {kind} loader, but this run's data is map-style (packed): "
                "resume with the data settings the checkpoint was made with."
            )
        check_batch_index(state["index"], self.batches_per_epoch)
        self.seed, self.epoch, self.index = state["seed"], state["epoch"], state["index"]
        self._order = self._permutation()
