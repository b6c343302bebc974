"""Tiny documents, files holding them, and the token stream they should make, for the data pipeline tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from titanpod.data import builtin_tokenizer_path, load_tokenizer
from titanpod.data.tokenizer import end_of_text_id

TOKENIZER = load_tokenizer(builtin_tokenizer_path())
EOT = end_of_text_id(TOKENIZER)
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "small",
    "birds",
    "sing",
    "in",
    "the",
    "old",
    "green",
    "tree",
]


def documents(count: int = 40, seed: int = 0) -> list[str]:
    """``count`` one-line documents of varied length, each starting with a unique marker."""
    rng = random.Random(seed)
    return [f"record {i:04d} " + " ".join(rng.choices(WORDS, k=rng.randint(3, 30))) + "." for i in range(count)]


def token_stream(docs: list[str]) -> list[int]:
    """The documents tokenized by hand: each one's ids, then the end-of-text id."""
    stream: list[int] = []
    for doc in docs:
        stream.extend(TOKENIZER.encode(doc, add_special_tokens=False).ids)
        stream.append(EOT)
    return stream


def write(docs: list[str], folder: Path, kind: str, name: str = "docs") -> Path:
    """Write ``docs`` as a ``kind`` file (json array, jsonl, parquet, text) in ``folder``."""
    if kind == "json":
        path = folder / f"{name}.json"
        path.write_text(json.dumps([{"id": i, "text": doc} for i, doc in enumerate(docs)]), encoding="utf-8")
    elif kind == "jsonl":
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": i, "text": doc}) + "\n" for i, doc in enumerate(docs)), "utf-8")
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / f"{name}.parquet"
        pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}), path)
    else:
        path = folder / f"{name}.txt"
        path.write_text("\n".join(docs) + "\n", encoding="utf-8")
    return path


def window_offsets(batches: list[tuple[torch.Tensor, ...]], stream: list[int], seq_len: int) -> list[int]:
    """Where in ``stream`` each sequence of ``batches`` starts; asserts each is a window at a multiple of seq_len."""
    offsets = []
    reference = torch.tensor(stream)
    for batch in batches:
        tokens, labels = batch[0], batch[1]
        for row in range(tokens.shape[0]):
            window = torch.cat([tokens[row], labels[row, -1:]])
            found = [
                k
                for k in range(0, len(stream) - seq_len, seq_len)
                if torch.equal(reference[k : k + seq_len + 1], window)
            ]
            assert found, f"sequence {tokens[row].tolist()} is not a window of the hand-made stream"
            offsets.append(found[0])
    return offsets


def same(first: list[tuple[torch.Tensor, ...]], second: list[tuple[torch.Tensor, ...]]) -> bool:
    """Whether two lists of batches are equal element for element (dtype included)."""
    return len(first) == len(second) and all(
        len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))
        for a, b in zip(first, second, strict=True)
    )


@pytest.fixture(autouse=True)
def private_datasets_cache(tmp_path, monkeypatch):
    """Keep the ``datasets`` library's Arrow cache of each test's files inside its tmp_path."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")
