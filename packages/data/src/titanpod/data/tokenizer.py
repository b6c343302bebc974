"""Loading a Hugging Face ``tokenizer.json``: built in, from a local path, or from the Hub."""

from __future__ import annotations

import re
from pathlib import Path

from tokenizers import Tokenizer

from titanpod.data.shipped import builtin_tokenizer_path

BUILTIN = "builtin"
"""``data.tokenizer`` value naming the shipped 1,152-token tokenizer (what ``None`` means without ``init_from``)."""
END_OF_TEXT_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
"""Names a tokenizer may give the token that separates documents."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""``owner/name``, the shape of a Hub repository id."""


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


def resolve_tokenizer(spec: str, revision: str | None = None) -> Tokenizer:
    """The tokenizer ``data.tokenizer`` names: ``builtin``, a local path, or a Hub model id (downloaded at
    ``revision``: a branch, tag or commit; default the main branch)."""
    if spec == BUILTIN:
        return load_tokenizer(builtin_tokenizer_path())
    if Path(spec).exists() or not _HUB_ID.match(spec):
        return load_tokenizer(spec)
    return load_tokenizer(_download_tokenizer(spec, revision))


def _download_tokenizer(repo_id: str, revision: str | None = None) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, "tokenizer.json", revision=revision))
    except Exception as error:  # offline, unknown repo, gated repo, no tokenizer.json: all end the same way
        deepest: BaseException = error
        for _ in range(8):  # the innermost cause says most: "offline mode is enabled", "401 ... gated"
            deepest = deepest.__cause__ or deepest.__context__ or deepest
        first_line = (str(deepest).strip().splitlines() or ["(no message)"])[0]
        raise ValueError(
            f"Cannot get tokenizer.json of the Hub model {repo_id!r} ({type(error).__name__}: {first_line}). "
            f"Check the id and the network (and `hf auth login` for a gated model), or download its tokenizer.json "
            f"and pass the local path: --data.tokenizer path/to/tokenizer.json."
        ) from error


def end_of_text_id(tokenizer: Tokenizer) -> int:
    """The id of the document separator token; ``KeyError`` if the tokenizer has none."""
    for name in END_OF_TEXT_CANDIDATES:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return token_id
    raise KeyError(f"The tokenizer has none of the end-of-text tokens {', '.join(END_OF_TEXT_CANDIDATES)}.")


def check_fits(tokenizer: Tokenizer, spec: str, vocab_size: int, model: str = "the model", fix: str = "") -> None:
    """Refuse a tokenizer whose ids would not all index the embedding table of ``model`` (its words in the
    message), naming both sizes and ``fix`` (by default: pick a larger flavor or a smaller tokenizer)."""
    size = tokenizer.get_vocab_size()
    if size > vocab_size:
        fix = fix or (
            f"pick a model flavor with a vocabulary of at least {size:,}, or a smaller tokenizer (--data.tokenizer)."
        )
        raise ValueError(
            f"The tokenizer {spec!r} has {size:,} tokens but {model}'s vocabulary has {vocab_size:,} rows: its ids "
            f"past {vocab_size - 1:,} would index no embedding. {fix[:1].upper()}{fix[1:]}"
        )
