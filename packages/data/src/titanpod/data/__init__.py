"""Data for training: sources, tokenizers, packing into fixed-length batches, per-rank sharding, resumable loaders.

``build_data`` is the entry point; the ``datasets`` library is imported only when local files or
the Hub are read.
"""

from titanpod.data.config import SOURCES, DataConfig
from titanpod.data.packing import PackedBatches, pack_documents
from titanpod.data.pipeline import TrainData, ValidationBatches, build_data, gather_data_state
from titanpod.data.shipped import builtin_corpus_path, builtin_tokenizer_path
from titanpod.data.sources import DataError
from titanpod.data.streaming import StreamingBatches
from titanpod.data.synthetic import SyntheticBatches
from titanpod.data.tokenizer import load_tokenizer, resolve_tokenizer

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
