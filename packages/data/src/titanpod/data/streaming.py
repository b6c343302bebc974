"""Packing a stream of documents (a streaming ``datasets.IterableDataset``) into batches, in order, per rank.

Each rank reads its own shard of documents, tokenizes them as it goes and cuts the concatenated
tokens into windows of ``seq_len + 1`` (consecutive windows share one token, as in PackedBatches).

Resume is exact without saving tokens: for every document still in the token buffer the packer
keeps the dataset's ``state_dict`` from just before that document was read. The saved position is
that snapshot for the oldest buffered document plus how many of its tokens were already used.

Legend: B batch, S sequence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from titanpod.data.packing import mask_documents
from titanpod.data.rank_state import this_rank_state
from titanpod.data.sources import DataError, first_line

if TYPE_CHECKING:
    from datasets import IterableDataset

READ_CHUNK = 64
"""Documents read and tokenized together."""


class _Document(NamedTuple):
    epoch: int
    snapshot: dict[str, Any] | None  # the dataset's state before this document; None: the start of the epoch
    start: int  # absolute position of the document's first token
    length: int  # its tokens, separator included


class StreamingBatches:
    """Endless batches packed from a stream of documents, cycling through it epoch after epoch.

    ``open_dataset`` makes a fresh iterable dataset of this rank's documents (already sharded);
    ``encode`` turns texts into lists of token ids; ``text`` picks a row's text. With ``repeat``
    False the batches end with the stream (for validation). ``explain`` turns an error raised while
    reading into the one to raise (e.g. naming the file at fault).
    """

    batches_per_epoch = None
    """Unknown for a stream."""

    def __init__(
        self,
        open_dataset: Callable[[], IterableDataset],
        encode: Callable[[list[str]], list[list[int]]],
        text: Callable[[dict[str, Any]], str],
        separator_id: int,
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        document_masking: bool = False,
        repeat: bool = True,
        explain: Callable[[Exception], Exception] | None = None,
    ) -> None:
        self._open_dataset, self._encode, self._text, self._explain = open_dataset, encode, text, explain
        self.separator_id, self.seq_len, self.batch_size = separator_id, seq_len, batch_size
        self.rank, self.world_size, self.document_masking, self.repeat = rank, world_size, document_masking, repeat
        self.index = 0
        self._restart(epoch=0, snapshot=None, skip=0)

    def _restart(self, epoch: int, snapshot: dict[str, Any] | None, skip: int) -> None:
        self._tokens: list[int] = []  # tokens from absolute position self._base on
        self._documents: list[int] = []  # the document number of each
        self._base = self._start = 0  # self._start: the next window's first token
        self._buffered: deque[_Document] = deque()
        self._skip, self._document = skip, 0
        self._open(epoch, snapshot)

    def _open(self, epoch: int, snapshot: dict[str, Any] | None) -> None:
        self._dataset = self._open_dataset()
        self._dataset.set_epoch(epoch)
        if snapshot is not None:
            self._dataset.load_state_dict(snapshot)
        self._iterator = iter(self._dataset)
        self._epoch, self._snapshot, self._read_this_epoch = epoch, snapshot, 0

    def _read(self) -> bool:
        """Read and buffer up to ``READ_CHUNK`` documents; False when the stream ended (and does not repeat)."""
        texts: list[str] = []
        origins: list[tuple[int, dict[str, Any] | None]] = []
        while len(texts) < READ_CHUNK:
            try:
                example = next(self._iterator)
            except StopIteration:
                if self._read_this_epoch == 0 and self._snapshot is None:
                    raise DataError(f"The data stream of rank {self.rank} holds no documents.") from None
                if not self.repeat:
                    break
                self._open(self._epoch + 1, None)
                continue
            except Exception as error:  # a file that does not parse, a dropped connection
                if self._explain is not None:
                    raise self._explain(error) from error
                raise DataError(
                    f"Reading the data stream failed on rank {self.rank} (epoch {self._epoch}, after "
                    f"{self._read_this_epoch} documents of it): {first_line(error)}"
                ) from error
            origins.append((self._epoch, self._snapshot))
            texts.append(self._text(example))
            self._snapshot = self._dataset.state_dict()
            self._read_this_epoch += 1
        for (epoch, snapshot), ids in zip(origins, self._encode(texts), strict=True):
            ids = [*ids, self.separator_id]
            end = self._base + len(self._tokens)
            self._buffered.append(_Document(epoch, snapshot, end - self._skip, len(ids)))
            ids, self._skip = ids[self._skip :], 0
            self._tokens.extend(ids)
            self._documents.extend([self._document] * len(ids))
            self._document += 1
        return bool(texts)

    def __iter__(self) -> StreamingBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, ...]:
        need = self.batch_size * self.seq_len + 1
        while self._base + len(self._tokens) - self._start < need:
            if not self._read():
                raise StopIteration
        offset = self._start - self._base
        window_BS1 = torch.tensor(self._tokens[offset : offset + need], dtype=torch.int64)
        window_BS1 = window_BS1.unfold(0, self.seq_len + 1, self.seq_len)
        documents_BS1 = torch.tensor(self._documents[offset : offset + need]).unfold(0, self.seq_len + 1, self.seq_len)
        self._start += need - 1
        while self._buffered and self._buffered[0].start + self._buffered[0].length <= self._start:
            self._buffered.popleft()
        del self._tokens[: self._start - self._base], self._documents[: self._start - self._base]
        self._base = self._start
        self.index += 1
        if self.document_masking:
            return mask_documents(window_BS1, documents_BS1)
        return window_BS1[:, :-1].contiguous(), window_BS1[:, 1:].contiguous()

    @property
    def epoch(self) -> int:
        """The pass over the stream that the next batch starts in."""
        return self._buffered[0].epoch if self._buffered else self._epoch

    def state_dict(self) -> dict[str, Any]:
        """This rank's position: the epoch, the dataset's state before the oldest document not fully used, the
        tokens of that document already used, and the batches served. Plain JSON-able data, no token ids."""
        if self._buffered:
            oldest = self._buffered[0]
            epoch, snapshot, skip = oldest.epoch, oldest.snapshot, self._start - oldest.start
        else:
            epoch, snapshot, skip = self._epoch, self._snapshot, self._skip
        return {
            "kind": "streaming",
            "epoch": epoch,
            "dataset": snapshot,
            "skip_tokens": skip,
            "index": self.index,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by ``state_dict`` (or this rank's entry of ``{"per_rank": [...]}``)."""
        state = this_rank_state(state, "streaming", self.rank, self.world_size, "data", "gather_data_state")
        self.index = state["index"]
        self._restart(state["epoch"], state["dataset"], state["skip_tokens"])
