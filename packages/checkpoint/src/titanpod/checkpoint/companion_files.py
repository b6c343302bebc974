"""The small files that travel with a model's weights: its tokenizer and its generation defaults.

``titanpod-convert import`` copies them from the source into the titanpod checkpoint folder, and every
Hugging Face export writes them beside config.json, so ``AutoTokenizer.from_pretrained`` and ``generate``
work on the exported folder as on the source. Only these names are copied, as bytes: nothing is parsed or
unpickled.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from titanpod.checkpoint.special_tokens import GENERATION_CONFIG_FILE

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
"""A tokenizer's files as transformers saves them (fast, sentencepiece and byte-level BPE forms)."""
COMPANION_FILES = (*TOKENIZER_FILES, GENERATION_CONFIG_FILE)
"""Every file that travels with the weights."""

Files = Mapping[str, str | bytes]
"""File name -> content (text or bytes), written beside the weights."""


def read_companions(directory: Path | str) -> dict[str, bytes]:
    """The companion files ``directory`` holds, by name, as bytes."""
    directory = Path(directory)
    return {name: (directory / name).read_bytes() for name in COMPANION_FILES if (directory / name).is_file()}


def has_tokenizer(files: Files) -> bool:
    """Whether ``files`` hold a tokenizer ``AutoTokenizer`` can load (a tokenizer.json or a sentencepiece model)."""
    return "tokenizer.json" in files or "tokenizer.model" in files


def write_files(directory: Path, files: Files) -> None:
    """Write each of ``files`` into ``directory`` (text as UTF-8)."""
    for name, content in files.items():
        if isinstance(content, bytes):
            (directory / name).write_bytes(content)
        else:
            (directory / name).write_text(content, encoding="utf-8")
