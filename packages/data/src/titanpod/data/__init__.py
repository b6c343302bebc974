"""Data for training: sources, tokenizers, packing into fixed-length batches, per-rank sharding, resumable loaders.

``build_data`` is the entry point; the ``datasets`` library is imported only when local files or
the Hub are read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from titanpod.data.config import SOURCES, DataConfig
    from titanpod.data.packing import PackedBatches, pack_documents
    from titanpod.data.pipeline import TrainData, ValidationBatches, build_data, gather_data_state
    from titanpod.data.shipped import builtin_corpus_path, builtin_tokenizer_path
    from titanpod.data.sources import DataError
    from titanpod.data.streaming import StreamingBatches
    from titanpod.data.synthetic import SyntheticBatches
    from titanpod.data.tokenizer import load_tokenizer, resolve_tokenizer

_HOMES = {
    "SOURCES": "titanpod.data.config",
    "DataConfig": "titanpod.data.config",
    "PackedBatches": "titanpod.data.packing",
    "pack_documents": "titanpod.data.packing",
    "TrainData": "titanpod.data.pipeline",
    "ValidationBatches": "titanpod.data.pipeline",
    "build_data": "titanpod.data.pipeline",
    "gather_data_state": "titanpod.data.pipeline",
    "builtin_corpus_path": "titanpod.data.shipped",
    "builtin_tokenizer_path": "titanpod.data.shipped",
    "DataError": "titanpod.data.sources",
    "StreamingBatches": "titanpod.data.streaming",
    "SyntheticBatches": "titanpod.data.synthetic",
    "load_tokenizer": "titanpod.data.tokenizer",
    "resolve_tokenizer": "titanpod.data.tokenizer",
}
"""Where each public name lives: imported on first use, so a module of this package that needs none of them
(a config dataclass the command line reads) is imported without the rest."""

__all__ = [
    "SOURCES",
    "DataConfig",
    "DataError",
    "PackedBatches",
    "StreamingBatches",
    "SyntheticBatches",
    "TrainData",
    "ValidationBatches",
    "build_data",
    "builtin_corpus_path",
    "builtin_tokenizer_path",
    "gather_data_state",
    "load_tokenizer",
    "pack_documents",
    "resolve_tokenizer",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'titanpod.data' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
