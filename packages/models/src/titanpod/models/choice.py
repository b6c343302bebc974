"""Picking one of several named options, with an error that lists them and names the closest."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any


def choose(kind: str, name: str, options: Mapping[str, Any]) -> Any:
    """``options[name]``, or a ``KeyError`` that lists the options and names the closest."""
    if name in options:
        return options[name]
    close = difflib.get_close_matches(name, list(options), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise KeyError(f"Unknown {kind} {name!r}; choose one of {', '.join(options)}.{hint}")
