"""Data for training: tokenizers, the built-in corpus, packing into fixed-length batches."""

from titanpod.recipes.data.config import DataConfig
from titanpod.recipes.data.packing import PackedBatches, pack_documents
from titanpod.recipes.data.shipped import builtin_corpus_path, builtin_tokenizer_path
from titanpod.recipes.data.tokenizer import load_tokenizer

__all__ = [
    "DataConfig",
    "PackedBatches",
    "builtin_corpus_path",
    "builtin_tokenizer_path",
    "load_tokenizer",
    "pack_documents",
]
