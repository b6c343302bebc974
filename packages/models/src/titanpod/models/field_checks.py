"""Checks of config values, run by each config dataclass's ``__post_init__`` before any work is done.

A whole-number field holds an ``int`` (not a ``bool``, a ``float`` or a string) that fits int64; a
real-number field an ``int`` or ``float`` that is finite (never NaN or Inf); a boolean field a ``bool``.
Each refusal is a ``ValueError`` naming the field as a recipe spells it (``train.lr``), what it holds and
what it takes. Every layer's configs use these (this is the lowest layer their packages all import).

A field declared with ``metadata=SAME_MATHS`` picks how a result is computed (a kernel, its tiles), never the
result: a resumed run may change it (``same_maths_fields`` of the recipe's class, which
``titanpod.checkpoint.recipe_changes`` lets through).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range every whole-number field must fit: the values reach tensors and generators as int64."""
SAME_MATHS_KEY = "same_maths"
"""The field-metadata key of ``SAME_MATHS`` (a module that imports nothing of titanpod writes it as it is)."""
SAME_MATHS: Mapping[str, bool] = types.MappingProxyType({SAME_MATHS_KEY: True})
"""Field metadata of a setting, or a whole section, that changes how a result is computed and never the result."""
PAST_FLOAT_RANGE = " (a number past the float range, such as 1e999, reads as inf)"
"""What an infinity in a config most likely came from, added to the refusal."""


def whole_number(field: str, value: object, *, at_least: int | None = None, at_most: int | None = None) -> int:
    """``value`` when it is an ``int`` (not a ``bool``) within ``[at_least, at_most]`` and int64; else
    ``ValueError`` naming ``field`` (``train.steps``), the value and the range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be a whole number, got {value!r}{_how_to_write(field, value)}.")
    if (at_least is not None and value < at_least) or (at_most is not None and value > at_most):
        raise ValueError(f"{field} must be {_range_words(at_least, None, None, at_most)}, got {value}.")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{field} must fit in 64 bits (at most {INT64_MAX}), got {value}.")
    return value


def real_number(
    field: str,
    value: object,
    *,
    at_least: float | None = None,
    above: float | None = None,
    below: float | None = None,
    at_most: float | None = None,
) -> float:
    """``value`` when it is a finite ``int`` or ``float`` (not a ``bool``) within the bounds given (``at_least``
    and ``at_most`` included, ``above`` and ``below`` excluded); else ``ValueError`` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field} must be a number, got {value!r}{_how_to_write(field, value)}.")
    finite = abs(value) <= sys.float_info.max if isinstance(value, int) else math.isfinite(value)
    if not finite:  # an int past the float range is no number a float field can hold either
        past = PAST_FLOAT_RANGE if isinstance(value, float) and math.isinf(value) else ""
        raise ValueError(f"{field} must be a finite number, got {value}{past}.")
    too_low = (at_least is not None and value < at_least) or (above is not None and value <= above)
    too_high = (at_most is not None and value > at_most) or (below is not None and value >= below)
    if too_low or too_high:
        raise ValueError(f"{field} must be {_range_words(at_least, above, below, at_most)}, got {value}.")
    return value


def expand_home(config: object, *fields: str) -> None:
    """Replace a leading ``~`` in each of ``config``'s path ``fields`` by the home folder, as a shell would: a recipe
    file's path, or a flag written ``--x=~/y``, reaches the config unexpanded. Frozen dataclasses too."""
    for name in fields:
        value = getattr(config, name)
        if isinstance(value, str) and value.startswith("~"):
            object.__setattr__(config, name, os.path.expanduser(value))


def check_value(field: str, value: object, hint: Any) -> None:
    """``ValueError`` naming ``field`` when ``value`` does not fit type ``hint`` as a config holds it: ``int``
    (``whole_number``), ``float`` (``real_number``), ``bool``, or one of them or ``None``. Other types (strings,
    choices, sections, tuples) are left to their own checks."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return
        kinds = [arg for arg in args if arg is not type(None)]
        if len(kinds) != 1:
            return
        hint = kinds[0]
    if hint is int:
        whole_number(field, value)
    elif hint is float:
        real_number(field, value)
    elif hint is bool and not isinstance(value, bool):
        raise ValueError(f"{field} must be true or false, got {value!r}.")


def check_field_types(config: object, section: str) -> None:
    """``check_value`` of every field of dataclass ``config`` against its declared type, named ``section.name``
    (``train.lr``; ``section`` ``""``: ``name`` alone); fields that are sections themselves are checked in turn."""
    for name, hint in _field_hints(type(config)).items():
        value = getattr(config, name)
        field = f"{section}.{name}" if section else name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_field_types(value, field)
        else:
            check_value(field, value, hint)


def same_maths_fields(kind: type, section: str = "") -> tuple[str, ...]:
    """``fnmatch`` patterns of the dotted names (``kernels.attention``, ``kernels.pallas_loss.*``) of the fields of
    dataclass ``kind`` (a recipe class; named ``section`` when it is itself a section) and of its sections, marked
    ``SAME_MATHS``; an unmarked section is looked into."""
    names: list[str] = []
    for field in dataclasses.fields(kind):
        name, hint = f"{section}.{field.name}" if section else field.name, _field_hints(kind)[field.name]
        if field.metadata.get(SAME_MATHS_KEY):
            names.append(f"{name}.*" if dataclasses.is_dataclass(hint) else name)
        elif dataclasses.is_dataclass(hint):
            names += same_maths_fields(hint, name)
    return tuple(names)


@functools.cache
def _field_hints(kind: type) -> dict[str, Any]:
    hints = typing.get_type_hints(kind)
    return {field.name: hints[field.name] for field in dataclasses.fields(kind)}


def _how_to_write(field: str, value: object) -> str:
    """What ``value`` is, and how to write it when it is a number written the wrong way."""
    name = field.rpartition(".")[2]
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return " (text)"
        return f" (text): write the number without quotes, e.g. {name} = {value.strip()}"
    if isinstance(value, float) and math.isinf(value):
        return PAST_FLOAT_RANGE
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return f" (with a decimal point): write {name} = {int(value)}"
    return f" ({type(value).__name__})"


def _range_words(at_least: float | None, above: float | None, below: float | None, at_most: float | None) -> str:
    """``at least 0 and below 1``: the bounds given, in words."""
    words = [
        f"{word} {bound}"
        for word, bound in (("at least", at_least), ("above", above), ("below", below), ("at most", at_most))
        if bound is not None
    ]
    return " and ".join(words)
