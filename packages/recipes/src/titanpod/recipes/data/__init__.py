"""Data for training: sources, tokenizers, packing into fixed-length batches, per-rank sharding, resumable loaders.

``build_data`` is the entry point; the ``datasets`` library is imported only when local files or
the Hub are read.
"""

from titanpod.recipes.data.config import SOURCES, DataConfig
from titanpod.recipes.data.packing import PackedBatches, pack_documents
from titanpod.recipes.data.pipeline import TrainData, ValidationBatches, build_data, gather_data_state
from titanpod.recipes.data.shipped import builtin_corpus_path, builtin_tokenizer_path
from titanpod.recipes.data.sources import DataError
from titanpod.recipes.data.streaming import StreamingBatches
from titanpod.recipes.data.synthetic import SyntheticBatches
from titanpod.recipes.data.tokenizer import load_tokenizer, resolve_tokenizer

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
