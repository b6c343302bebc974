"""A local stand-in for a recipe's Hub dataset: the built-in corpus in a Hub dataset's layout.

The folder holds JSON-lines shards per split under the recipe's config name and a README
whose ``configs`` header names them, exactly what ``datasets.load_dataset(path, name,
split=..., streaming=True)`` reads from the Hub. A rehearsal streams it through the same
code path a pod run streams ``allenai/c4`` through, shard per rank included.
"""

from __future__ import annotations

import json
from pathlib import Path

from titanpod.data.shipped import builtin_corpus_path

TRAIN_SHARDS = 8
"""Training shards: more than the rehearsal's ranks, so each reads its own."""
VALIDATION_EVERY = 20
"""Every this many documents goes to the validation split."""


def write_hub_layout(folder: Path, config_name: str | None, train_split: str, validation_split: str | None) -> Path:
    """Write the built-in corpus to ``folder`` as a dataset with ``config_name`` and its splits; returns ``folder``."""
    documents = [part.strip() for part in builtin_corpus_path().read_text(encoding="utf-8").split("\n\n")]
    documents = [text for text in documents if text]
    held_out = [text for i, text in enumerate(documents) if validation_split and i % VALIDATION_EVERY == 0]
    training = [text for i, text in enumerate(documents) if not (validation_split and i % VALIDATION_EVERY == 0)]
    config = config_name or "default"
    subfolder = folder / config
    subfolder.mkdir(parents=True, exist_ok=True)
    splits = [(train_split, training, TRAIN_SHARDS)]
    if validation_split:
        splits.append((validation_split, held_out, 1))
    header = ["---", "configs:", f"- config_name: {config}", "  data_files:"]
    for split, texts, shards in splits:
        for shard in range(shards):
            name = f"{split}.{shard:05d}-of-{shards:05d}.json"
            lines = (json.dumps({"text": text}) for text in texts[shard::shards])
            (subfolder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        header += [f"  - split: {split}", f"    path: {config}/{split}.*.json"]
    (folder / "README.md").write_text("\n".join([*header, "---", ""]), encoding="utf-8")
    return folder
