"""The data part of a run's config."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from and how they are cut into batches."""

    source: str = "builtin"
    """``builtin``: the corpus shipped with titanpod.recipes. Other sources come with the data pipeline."""
    tokenizer: str = "builtin"
    """``builtin``, or the path of a Hugging Face ``tokenizer.json``."""
    seq_len: int = 256
    """Tokens per training sequence."""
    batch_size: int = 8
    """Sequences per batch on each process."""

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise ValueError(f"data.seq_len must be at least 2, got {self.seq_len}.")
        if self.batch_size < 1:
            raise ValueError(f"data.batch_size must be at least 1, got {self.batch_size}.")
