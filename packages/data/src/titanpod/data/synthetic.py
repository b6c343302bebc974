"""Uniformly random token ids, for benchmarks: no files, no tokenizer, exact resume from a batch index.

Legend: B batch, S sequence.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def synthetic_batch(
    vocab_size: int, seq_len: int, batch_size: int, key: str, document_masking: bool
) -> tuple[torch.Tensor, ...]:
    """One batch drawn from a generator seeded by ``key`` alone (so any batch can be remade from its key)."""
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1
    generator = torch.Generator().manual_seed(seed)
    window_BS1 = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=generator, dtype=torch.int64)
    tokens_BS, labels_BS = window_BS1[:, :-1].contiguous(), window_BS1[:, 1:].contiguous()
    if document_masking:  # one document per sequence
        return tokens_BS, labels_BS, torch.zeros(batch_size, seq_len, dtype=torch.int64)
    return tokens_BS, labels_BS


class SyntheticBatches:
    """Endless batches of random token ids; batch ``i`` of process ``rank`` depends only on (seed, rank, i)."""

    batches_per_epoch = None
    """No epochs: the data never repeats."""

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        document_masking: bool = False,
    ) -> None:
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.seed, self.rank, self.document_masking = seed, rank, document_masking
        self.index = 0

    def __iter__(self) -> SyntheticBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, ...]:
        key = f"train/{self.seed}/{self.rank}/{self.index}"
        self.index += 1
        return synthetic_batch(self.vocab_size, self.seq_len, self.batch_size, key, self.document_masking)

    def validation_batches(self, count: int) -> list[tuple[torch.Tensor, ...]]:
        """``count`` batches from a separate random stream, the same on every call."""
        return [
            synthetic_batch(
                self.vocab_size,
                self.seq_len,
                self.batch_size,
                f"validation/{self.seed}/{self.rank}/{index}",
                self.document_masking,
            )
            for index in range(count)
        ]

    def state_dict(self) -> dict[str, Any]:
        """The number of batches served (and the seed they were drawn with)."""
        return {"kind": "synthetic", "index": self.index, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the batches counted in a saved ``state_dict``."""
        if state.get("kind") != "synthetic":
            raise ValueError(
                f"The saved data position is of a {state.get('kind', 'packed')} loader, but this run's data is "
                "synthetic: resume with the data settings the checkpoint was made with."
            )
        self.seed, self.index = state["seed"], state["index"]
