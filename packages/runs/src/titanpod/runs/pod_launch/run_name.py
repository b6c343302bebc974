"""Whether a launched command names its run: a job torchrun restarts must, and is refused before torchrun starts.

Each restart resumes the run it finds by name; an unnamed run would start a new run at every attempt, and a
refusal from inside the job counts to torchrun as a failure it restarts. The name is looked for where the
command can give it: ``--output.run-name NAME`` (or ``=NAME``), ``--resume NAME``, or ``output.run_name`` of a
recipe file given with ``--recipe`` (JSON or TOML). A recipe file that cannot be read here is left to the run.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from pathlib import Path

NAME_FLAGS = ("--output.run-name", "--output.run_name", "--resume")
"""The flags that name the run."""


def names_its_run(command: Sequence[str]) -> bool:
    """True when ``command`` names its run (or names a recipe file this host cannot read, left to the run)."""
    for index, word in enumerate(command):
        flag, equals, value = word.partition("=")
        if flag in NAME_FLAGS:
            given = value if equals else (command[index + 1] if index + 1 < len(command) else "")
            if given and not given.startswith("--"):
                return True
        if flag == "--recipe":
            recipe = value if equals else (command[index + 1] if index + 1 < len(command) else "")
            if _recipe_file_names_run(recipe):
                return True
    return False


def _recipe_file_names_run(recipe: str) -> bool:
    """True when ``recipe`` is a recipe file with ``output.run_name`` set, or a file that cannot be read here."""
    path = Path(recipe)
    if path.suffix not in (".json", ".toml") or not path.is_file():
        return False
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError):
        return True  # the run says what is wrong with it
    output = data.get("output") if isinstance(data, dict) else None
    return isinstance(output, dict) and bool(output.get("run_name"))
