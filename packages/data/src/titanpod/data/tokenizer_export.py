"""A run's tokenizer as the files of a Hugging Face model folder: ``tokenizer.json``, ``tokenizer_config.json``
and ``special_tokens_map.json`` (what ``AutoTokenizer.from_pretrained`` reads), with the bos, eos and pad ids
the model was trained with.

Which token is which comes from the tokenizer folder's own ``tokenizer_config.json`` when ``data.tokenizer``
names a folder that has one (its chat template goes along); otherwise from the usual names
(``END_OF_TEXT_CANDIDATES`` for eos, the ones below for bos and pad). The built-in post-training tokenizer
(``chars``) stops at end of text and end of turn, so its eos is that list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from titanpod.data.sft.tokenizer import CHARS, SFTTokenizer, load_sft_tokenizer, read_chat_template
from titanpod.data.tokenizer import END_OF_TEXT_CANDIDATES, resolve_tokenizer

BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>")
"""Names a tokenizer may give the token that starts a sequence."""
PAD_CANDIDATES = ("<|pad|>", "<pad>", "<|finetune_right_pad_id|>")
"""Names a tokenizer may give its padding token."""
ROLES = ("bos_token", "eos_token", "pad_token", "unk_token")
"""The special-token roles tokenizer_config.json and special_tokens_map.json name."""


@dataclass(frozen=True)
class TokenizerExport:
    """A tokenizer's files for a model folder, and the special token ids it gives the model."""

    files: dict[str, str]
    """File name -> text: tokenizer.json, tokenizer_config.json, special_tokens_map.json."""
    bos_id: int | None
    """The id sequences start with, if the tokenizer has one."""
    eos_id: int | tuple[int, ...] | None
    """The id (or ids) generation stops at."""
    pad_id: int | None
    """The padding id, if the tokenizer has one."""


def _first_present(tokenizer: Tokenizer, names: tuple[str, ...]) -> str | None:
    return next((name for name in names if tokenizer.token_to_id(name) is not None), None)


def _named_tokens(folder: Path | None) -> dict[str, str]:
    """The role -> token text a tokenizer folder's tokenizer_config.json states (``{"content": ...}`` or text)."""
    path = folder / "tokenizer_config.json" if folder is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    named = {role: config.get(role) for role in ROLES}
    named = {role: value.get("content") if isinstance(value, dict) else value for role, value in named.items()}
    return {role: value for role, value in named.items() if isinstance(value, str)}


def _folder_of(spec: str) -> Path | None:
    path = Path(spec)
    return path if path.is_dir() else path.parent if path.is_file() else None


def tokenizer_export(spec: str, revision: str | None = None) -> TokenizerExport:
    """The files and special ids of the tokenizer ``data.tokenizer`` names (``builtin``, ``chars``, a path, or a
    Hub id read at ``revision``)."""
    if spec == CHARS:
        return post_training_export(load_sft_tokenizer(spec))
    tokenizer = resolve_tokenizer(spec, revision)
    folder = _folder_of(spec)
    named = _named_tokens(folder)
    template = read_chat_template(folder) if folder is not None else None
    tokens = {
        "bos_token": named.get("bos_token") or _first_present(tokenizer, BOS_CANDIDATES),
        "eos_token": named.get("eos_token") or _first_present(tokenizer, END_OF_TEXT_CANDIDATES),
        "pad_token": named.get("pad_token") or _first_present(tokenizer, PAD_CANDIDATES),
        "unk_token": named.get("unk_token"),
    }
    tokens = {role: token for role, token in tokens.items() if token is not None}
    return TokenizerExport(
        _files(tokenizer, tokens, {"chat_template": template} if template else None),
        *(tokenizer.token_to_id(tokens[role]) if role in tokens else None for role in ROLES[:3]),
    )


def post_training_export(sft: SFTTokenizer) -> TokenizerExport:
    """A post-training tokenizer with its chat template; eos is every id generation stops at (end of text, and
    end of turn where the tokenizer has one)."""
    config = sft.config()
    tokens = {role: config[role] for role in ROLES if role in config}
    eos = sft.stop_ids if len(sft.stop_ids) > 1 else sft.end_id
    pad = sft.tokenizer.token_to_id(tokens["pad_token"]) if "pad_token" in tokens else None
    return TokenizerExport(_files(sft.tokenizer, tokens, config), None, eos, pad)


def _files(tokenizer: Tokenizer, tokens: dict[str, str], config: dict[str, Any] | None = None) -> dict[str, str]:
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False, **(config or {})}
    config.update(tokens)
    return {
        "tokenizer.json": tokenizer.to_str(pretty=True),
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(tokens, indent=2) + "\n",
    }
