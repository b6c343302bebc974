"""The sequence length of a fine-tune from a checkpoint: the checkpoint's, not the toy recipe's.

``sft_debug`` packs rows of 64 tokens, enough for its reversed strings but not for a chat of a few messages. When
``--model.init-from FOLDER`` is given and ``--data.seq-len`` is not, the run takes the length from the folder:

- a titanpod model folder (or run directory) holds the ``recipe.json`` it was trained with: its ``data.seq_len``;
- a published checkpoint holds a ``config.json``: its ``max_position_embeddings``, at most ``PUBLISHED_SEQ_LEN``
  (rows that long for every batch would not fit a small machine; ``--data.seq-len`` sets another);
- a GGUF file states its context length: as ``max_position_embeddings``.

A Hub id, or a folder with neither file, leaves the recipe's length. Only small JSON files (or a GGUF file's
metadata) are read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from titanpod.recipes.command_line import flag_value

PUBLISHED_SEQ_LEN = 1024
"""The longest rows a fine-tune of a published checkpoint packs unless ``--data.seq-len`` says otherwise."""


def checkpoint_seq_len(init_from: str) -> int | None:
    """The sequence length a fine-tune of ``init_from`` uses (see the module docstring); ``None`` when the folder
    does not say."""
    from titanpod.checkpoint.gguf_files import GgufError, find_gguf, gguf_context_length

    try:
        gguf_file = find_gguf(init_from)
        positions: Any = gguf_context_length(gguf_file) if gguf_file is not None else None
    except GgufError:
        return None  # the run says what is wrong with the file
    if gguf_file is not None:
        return min(positions, PUBLISHED_SEQ_LEN) if positions else None
    folder = Path(init_from)
    recorded = _read(folder / "recipe.json").get("data")
    if isinstance(recorded, dict) and isinstance(recorded.get("seq_len"), int):
        return recorded["seq_len"]
    positions = _read(folder / "config.json").get("max_position_embeddings")
    return min(positions, PUBLISHED_SEQ_LEN) if isinstance(positions, int) and positions > 0 else None


def _read(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty when there is none or it cannot be read (the run reports it)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def with_checkpoint_seq_len(recipe: Any, argv: Sequence[str], init_from: str | None) -> Any:
    """``recipe`` (an SFT recipe) with the sequence length of the checkpoint ``--model.init-from`` names, unless
    ``argv`` gives ``--data.seq-len``."""
    if init_from is None or flag_value(argv, "--data.seq-len") is not None:
        return recipe
    seq_len = checkpoint_seq_len(init_from)
    if seq_len is None or seq_len == recipe.data.seq_len:
        return recipe
    return dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, seq_len=seq_len))
