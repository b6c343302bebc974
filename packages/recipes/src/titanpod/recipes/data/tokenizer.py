"""Loading a Hugging Face ``tokenizer.json``."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

END_OF_TEXT_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
"""Names a tokenizer may give the token that separates documents."""


def load_tokenizer(path: Path | str) -> Tokenizer:
    """Load a ``tokenizer.json`` (or a directory holding one), with an error that says what is wrong."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"No tokenizer at {path}: give the path of a Hugging Face tokenizer.json.")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception for malformed files
        raise ValueError(f"{path} is not a valid Hugging Face tokenizer.json: {error}") from error


def end_of_text_id(tokenizer: Tokenizer) -> int:
    """The id of the document separator token; ``KeyError`` if the tokenizer has none."""
    for name in END_OF_TEXT_CANDIDATES:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return token_id
    raise KeyError(f"The tokenizer has none of the end-of-text tokens {', '.join(END_OF_TEXT_CANDIDATES)}.")
