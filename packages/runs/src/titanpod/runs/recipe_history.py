"""A run directory's ``recipe.json`` and its history: the recipe every part of a run was started with.

``recipe.json`` is the recipe of the newest run of the directory. When a later run of the directory
(a resume with a longer ``train.steps``, or with changes ``checkpoint.allow_changes`` accepted)
brings a different recipe, the previous ``recipe.json`` is moved, not overwritten, to
``recipe-history/recipe-<UTC time it was replaced>.json``, so no recipe a checkpoint was trained
with is ever lost.
"""

from __future__ import annotations

import time
from pathlib import Path

RECIPE_FILE = "recipe.json"
"""The recipe of the run directory's newest run."""
HISTORY_FOLDER = "recipe-history"
"""Where earlier recipes of the run directory are kept."""


def record_recipe(run_dir: Path, recipe_json: str) -> Path | None:
    """Write ``recipe_json`` as ``run_dir/recipe.json``, first moving a different one there into
    ``recipe-history/``. Returns where the previous recipe went (``None``: there was none, or the same)."""
    current = Path(run_dir) / RECIPE_FILE
    kept = None
    if current.is_file():
        if current.read_bytes() == recipe_json.encode("utf-8"):  # any other bytes, even damaged ones, are kept
            return None
        history = Path(run_dir) / HISTORY_FOLDER
        history.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        kept = history / f"recipe-{stamp}.json"
        count = 1
        while kept.exists():
            kept = history / f"recipe-{stamp}-{count}.json"
            count += 1
        current.rename(kept)
    current.write_text(recipe_json, encoding="utf-8")
    return kept
