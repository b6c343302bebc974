"""The special token ids a model generates and stops with (bos, eos, pad), carried from a Hugging Face folder
through a titanpod checkpoint and back: config.json and generation_config.json hold them in the same keys."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENERATION_CONFIG_FILE = "generation_config.json"
"""transformers' generation defaults beside config.json: the ids ``generate`` starts, stops and pads with."""
KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
"""The keys the ids have in config.json, generation_config.json and titanpod's model.json."""

TokenIds = int | tuple[int, ...] | None
"""One id, several (an eos that is any of a list), or none."""


def _ids(value: Any, key: str) -> TokenIds:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple)):
        raise ValueError(f"{key} must be an integer, a list of integers or null, not {value!r}.")
    if isinstance(value, int):
        return value
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        raise ValueError(f"{key} must be an integer, a list of integers or null, not {value!r}.")
    return tuple(value)


@dataclass(frozen=True)
class SpecialTokens:
    """A model's bos, eos and pad ids, as config.json states them (an eos may be a list: any of them stops)."""

    bos: TokenIds = None
    """The id a sequence starts with, if the model has one."""
    eos: TokenIds = None
    """The id (or ids) generation stops at."""
    pad: TokenIds = None
    """The id that fills unused positions, if the model has one."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SpecialTokens:
        """The ids a config.json, generation_config.json or model.json dict states (absent keys are ``None``)."""
        bos, eos, pad = (_ids(config.get(key), key) for key in KEYS)
        return cls(bos, eos, pad)

    @classmethod
    def from_folder(cls, directory: Path | str) -> SpecialTokens:
        """The ids of a Hugging Face model folder: config.json's, each missing one taken from
        generation_config.json when that file states it."""
        found: dict[str, Any] = {}
        for name in (GENERATION_CONFIG_FILE, "config.json"):  # config.json's win
            path = Path(directory) / name
            if path.is_file():
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path} is not valid JSON: {error}") from error
                found.update({key: data[key] for key in KEYS if data.get(key) is not None})
        return cls.from_config(found)

    def as_config(self) -> dict[str, Any]:
        """The ids under config.json's keys (a list eos as a JSON list); ids that are ``None`` are left out."""
        values = dict(zip(KEYS, (self.bos, self.eos, self.pad), strict=True))
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in values.items()
            if value is not None
        }

    def generation_config(self) -> dict[str, Any]:
        """generation_config.json content that makes ``generate`` start, stop and pad with these ids."""
        return self.as_config()

    def __bool__(self) -> bool:
        return any(value is not None for value in (self.bos, self.eos, self.pad))
