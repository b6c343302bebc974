"""The corpus and tokenizer shipped inside this package (made by tools/make_builtin_data.py)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _shipped(name: str) -> Path:
    path = Path(str(files("titanpod.data").joinpath("builtin", name)))
    if not path.is_file():
        raise FileNotFoundError(
            f"The built-in {name} is missing from the titanpod-recipes install ({path}); reinstall titanpod-recipes."
        )
    return path


def builtin_corpus_path() -> Path:
    """Path of the built-in corpus: English-like paragraphs separated by blank lines."""
    return _shipped("corpus.txt")


def builtin_tokenizer_path() -> Path:
    """Path of the built-in byte-level BPE ``tokenizer.json``."""
    return _shipped("tokenizer.json")
