"""Packing documents into fixed-length sequences and serving them as batches.

Legend: B batch, S sequence, N tokens in the stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from tokenizers import Tokenizer


def pack_documents(documents: Iterable[str], tokenizer: Tokenizer, separator_id: int) -> torch.Tensor:
    """Tokenize ``documents`` and concatenate them, each followed by ``separator_id`` (int64 [N])."""
    encodings = tokenizer.encode_batch(list(documents), add_special_tokens=False)
    stream: list[int] = []
    for encoding in encodings:
        stream.extend(encoding.ids)
        stream.append(separator_id)
    return torch.tensor(stream, dtype=torch.int64)


class PackedBatches:
    """Batches of next-token windows cut from one token stream, reshuffled every epoch.

    The stream is split into non-overlapping windows of ``seq_len + 1`` tokens, each giving
    ``seq_len`` inputs and the ``seq_len`` labels shifted by one. Window order is a seeded
    permutation per epoch; process ``rank`` of ``world_size`` takes its own slice of every
    global batch. ``state_dict`` holds the position, so a resumed run sees the same batches.
    """

    def __init__(
        self, tokens_N: torch.Tensor, seq_len: int, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1
    ) -> None:
        n_windows = (tokens_N.numel() - 1) // seq_len
        global_batch = batch_size * world_size
        if n_windows < global_batch:
            raise ValueError(
                f"The data has {tokens_N.numel():,} tokens: {n_windows} sequences of {seq_len}, fewer than one "
                f"global batch of {global_batch}. Use more data, a shorter data.seq_len or a smaller data.batch_size."
            )
        self.windows_WS = tokens_N[: n_windows * seq_len + 1].unfold(0, seq_len + 1, seq_len)
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.batches_per_epoch = n_windows // global_batch
        self.epoch, self.index = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.windows_WS.shape[0], generator=generator)

    def __iter__(self) -> PackedBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.index == self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
            self._order = self._permutation()
        start = (self.index * self.world_size + self.rank) * self.batch_size
        window_BS1 = self.windows_WS[self._order[start : start + self.batch_size]]
        self.index += 1
        return window_BS1[:, :-1].contiguous(), window_BS1[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        """Where the iterator stands: epoch and batch index within it."""
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by ``state_dict``."""
        self.seed, self.epoch, self.index = state["seed"], state["epoch"], state["index"]
        self._order = self._permutation()
