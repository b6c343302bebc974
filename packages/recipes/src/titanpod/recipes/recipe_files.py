"""Recipe files: a run's ``recipe.json`` given back to a command, or a TOML file written by hand.

Both formats hold the same mapping as ``RecipeFile.to_dict``, nested by section. Two shapes are read:

- a whole recipe (a run's ``recipe.json``): fields left out take the recipe class's defaults;
- a top-level ``base`` key naming a recipe (as ``--recipe`` would), plus only the fields that differ from it::

    base = "llama3_debug"
    name = "my_llama"

    [train]
    steps = 200
    lr = 1e-3

TOML has no null: leave a field out to keep the base's value. Command-line flags apply on top of the file. A file
that lowers ``train.steps`` without ``warmup_steps`` keeps the base's warmup share (``titanpod.recipes.warmup``).
An unknown field is named with the closest known one.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from titanpod.recipes.warmup import with_scaled_warmup

RECIPE_FILE_SUFFIXES = (".json", ".toml")
"""Suffixes that make ``--recipe`` read a file instead of looking up a recipe name."""

BASE_KEY = "base"
"""The top-level key of a recipe file that names the recipe its fields override."""


def is_recipe_file(name: str) -> bool:
    """Whether ``--recipe name`` names a recipe file (by its suffix) rather than a named recipe."""
    return Path(name).suffix.lower() in RECIPE_FILE_SUFFIXES


def read_recipe_data(path: Path) -> dict[str, Any]:
    """The mapping in recipe file ``path`` (JSON or TOML); ``ValueError`` names the file and what is wrong."""
    if not path.is_file():
        raise ValueError(
            f"--recipe {path}: no such recipe file; give a recipe.json or .toml path, or a name from --list-recipes."
        )
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except ValueError as error:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise ValueError(f"--recipe {path} is not valid {kind}: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"--recipe {path} must hold a mapping of recipe fields, not {type(data).__name__}.")
    return data


def merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` applied, section by section (a nested mapping merges, any other value replaces)."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def load_recipe_file(path: Path, named: Callable[[str], Any], kind_of: Callable[[Mapping[str, Any]], type]) -> Any:
    """The recipe in file ``path``.

    ``named(name)`` builds the recipe a ``base`` key names (``KeyError`` for an unknown one); ``kind_of(data)``
    gives the recipe class of a whole recipe without ``base``. ``ValueError`` names the file and the field.
    """
    data = read_recipe_data(path)
    base_name = data.pop(BASE_KEY, None)
    if base_name is not None:
        if not isinstance(base_name, str):
            raise ValueError(f"--recipe {path}: {BASE_KEY} must name a recipe (a string), got {base_name!r}.")
        try:
            base = named(base_name)
        except KeyError as error:
            raise ValueError(f"--recipe {path}: {BASE_KEY} = {base_name!r}: {error.args[0]}") from error
        steps = (data.get("train") or {}).get("steps") if isinstance(data.get("train"), Mapping) else None
        if isinstance(steps, int) and "warmup_steps" not in data["train"]:
            base = with_scaled_warmup(base, steps)  # a shorter run keeps its warmup's share: titanpod.recipes.warmup
        recipe_type, data = type(base), merged(base.to_dict(), data)
    else:
        recipe_type = kind_of(data)
    try:
        check_sections(recipe_type, data, "recipe")
        recipe = recipe_type.from_dict(data)
        check_choices(recipe, "recipe")
    except (ValueError, TypeError) as error:  # unknown fields, refused values, wrong shapes
        raise ValueError(
            f"--recipe {path} is not a recipe titanpod can read: {error} (--help lists every field and its choices)"
        ) from error
    return recipe


def check_sections(kind: type, data: Mapping[str, Any], where: str) -> None:
    """``ValueError`` naming the field where ``data`` gives a plain value for a section (a dataclass field) of
    ``kind``; unknown names are left to ``RecipeFile.from_dict``, which names them."""
    hints = typing.get_type_hints(kind)
    for name, value in data.items():
        hint = hints.get(name)
        if hint is None or not dataclasses.is_dataclass(hint):
            continue
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}.{name} is a section of fields, got {value!r}.")
        check_sections(hint, value, f"{where}.{name}")


def literal_choices(hint: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal`` type (or an optional one) allows; ``None`` for any other type."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        inner = [literal_choices(arg) for arg in args if arg is not type(None)]
        if len(inner) == 1 and inner[0] is not None:
            return (*inner[0], None) if type(None) in args else inner[0]
    return None


def check_choices(config: Any, where: str) -> None:
    """``ValueError`` naming the field and its choices where a ``Literal`` field of dataclass ``config`` (or of a
    section within it) holds another value."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, hint = getattr(config, field.name), hints[field.name]
        if dataclasses.is_dataclass(hint):
            check_choices(value, f"{where}.{field.name}")
            continue
        choices = literal_choices(hint)
        if choices is not None and value not in choices:
            raise ValueError(f"{where}.{field.name} must be one of {', '.join(map(str, choices))}; got {value!r}.")
