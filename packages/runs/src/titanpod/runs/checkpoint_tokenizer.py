"""The tokenizer of a run that starts from a checkpoint (``model.init_from``): refused when its ids do not all fit
the model's vocabulary, and named when it is not the checkpoint's own."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from titanpod.checkpoint.pretrained import TOKENIZER_FILE, PretrainedFolder
from titanpod.data.config import DataConfig
from titanpod.data.tokenizer import check_fits, load_tokenizer, resolve_tokenizer


def _same_place(spec: str, folder: Path) -> bool:
    path = Path(spec)
    path = path.parent if path.name == TOKENIZER_FILE else path
    return path.exists() and path.resolve() == folder.resolve()


def check_run_tokenizer(
    tokenizer: Tokenizer, spec: str, vocab_size: int, folder: PretrainedFolder | None
) -> str | None:
    """Refuse ``tokenizer`` (named ``spec``) when it has more tokens than the model's ``vocab_size`` rows: the
    ``ValueError`` names both, and with ``folder`` (the run's ``init_from``) says to train with the checkpoint's own
    tokenizer instead. Otherwise, when ``folder`` has a tokenizer and ``tokenizer`` maps tokens to other ids, return
    a line saying so (the checkpoint's embeddings are then read as other tokens); else ``None``."""
    if folder is None:
        check_fits(tokenizer, spec, vocab_size)
        return None
    own = folder.tokenizer_folder
    if own is None:
        fix = "give the tokenizer the checkpoint was trained with: --data.tokenizer with its tokenizer.json or folder."
    else:
        fix = (
            f"leave --data.tokenizer unset to train with the checkpoint's own tokenizer ({own / TOKENIZER_FILE}), "
            f"or give one of at most {vocab_size:,} tokens."
        )
    check_fits(tokenizer, spec, vocab_size, f"the model of model.init_from {folder.source!r}", fix)
    if own is None or _same_place(spec, own):
        return None
    theirs = load_tokenizer(own)
    if theirs.get_vocab(with_added_tokens=True) == tokenizer.get_vocab(with_added_tokens=True):
        return None
    return (
        f"data.tokenizer {spec!r} ({tokenizer.get_vocab_size():,} tokens) is not the tokenizer of model.init_from "
        f"({own / TOKENIZER_FILE}, {theirs.get_vocab_size():,} tokens): the checkpoint's embeddings will be read as "
        "other tokens. Leave --data.tokenizer unset to train with the checkpoint's own."
    )


def check_text_tokenizer(data: DataConfig, vocab_size: int, folder: PretrainedFolder | None) -> str | None:
    """``check_run_tokenizer`` for a pretraining run's data (nothing to check without ``folder`` or a tokenizer:
    the data pipeline checks the fit itself)."""
    if folder is None or data.source == "synthetic" or data.tokenizer is None:
        return None
    tokenizer = resolve_tokenizer(data.tokenizer, data.tokenizer_revision)
    return check_run_tokenizer(tokenizer, data.tokenizer, vocab_size, folder)
