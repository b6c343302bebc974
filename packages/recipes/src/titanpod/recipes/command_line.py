"""What the three apps share on the command line: the ``--recipe`` value, tyro parsing with clean help, and
booleans given the old way (``--flag True``).

Each app describes its command as a frozen dataclass whose ``recipe`` field holds the recipe, its fields at the
top of the command line (``--train.steps``), beside the app's own flags (``--recipe``, ``--dry-run`` ...).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import typing
from collections.abc import Callable, Sequence
from typing import TypeVar

import tyro
from tyro.constructors import ConstructorRegistry, StructConstructorSpec, StructTypeInfo

from titanpod.recipes.warmup import with_scaled_warmup

Command = TypeVar("Command")
Recipe = TypeVar("Recipe")

RECIPE_FLAG = "--recipe"
"""The flag whose value (a recipe name or file) gives every other flag its default."""

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def recipe_argument(argv: Sequence[str], default: str) -> str:
    """The value of the last ``--recipe NAME`` or ``--recipe=NAME`` in ``argv``, else ``default``."""
    value = default
    for index, arg in enumerate(argv):
        if arg == RECIPE_FLAG and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith(RECIPE_FLAG + "="):
            value = arg.split("=", 1)[1]
    return value


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag VALUE`` or ``flag=VALUE`` in ``argv`` (``_`` and ``-`` alike in the name, as
    tyro reads them), else ``None``."""
    wanted = flag.replace("_", "-")
    value = None
    for index, arg in enumerate(argv):
        name, equals, given = arg.partition("=")
        if not name.startswith("--") or name.replace("_", "-") != wanted:
            continue
        if equals:
            value = given
        elif index + 1 < len(argv):
            value = argv[index + 1]
    return value


def with_steps_scaled(recipe: Recipe, argv: Sequence[str]) -> Recipe:
    """``recipe`` ready for the ``--train.steps`` in ``argv``: a shorter run than the recipe's warms up for the same
    share of its steps (``titanpod.recipes.warmup``), unless ``--train.warmup-steps`` is given too."""
    steps = flag_value(argv, "--train.steps")
    if steps is None or flag_value(argv, "--train.warmup-steps") is not None:
        return recipe
    try:
        return with_scaled_warmup(recipe, int(steps))
    except ValueError:  # not a number: tyro refuses it, naming the flag
        return recipe


def optional_value(argv: Sequence[str], flag: str, bare: str = "") -> list[str]:
    """``argv`` with each ``flag`` given no value (the last argument, or one followed by another flag)
    written as ``flag bare``, so a flag whose value may be left out (``--resume``, ``--resume NAME``) parses; the
    older boolean form is kept working: ``flag True`` is the flag alone, ``flag False`` leaves it out."""
    out: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        following = argv[index + 1] if index + 1 < len(argv) else None
        if arg != flag:
            out.append(arg)
        elif following is None or following.startswith("-"):
            out += [flag, bare]
        elif following.lower() in _TRUE + _FALSE:
            out += [flag, bare] if following.lower() in _TRUE else []
            index += 1
        else:
            out += [flag, following]
            index += 1
        index += 1
    return out


def first_sentence(text: str | None) -> str:
    """The first whole sentence of ``text`` (a recipe's docstring) on one line: up to the first ``.``, ``!`` or
    ``?`` followed by the end or by a space and a capital, digit or bracket (``e.g.``, ``i.e.``, ``etc.``, ``vs.``
    and ``3.1`` do not end one); all of it when no sentence ends."""
    flat = " ".join((text or "").split())
    end = _SENTENCE_END.search(flat)
    return flat[: end.end()] if end else flat


def listing_line(name: str, description: str | None, width: int) -> str:
    """A ``--list-recipes`` line: the name padded to ``width``, then the first sentence of its description as
    plain text (code spans without their double backticks, as ``--help`` shows them)."""
    return f"{name:{width}s} {first_sentence(description).replace('``', '')}"


_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)[.!?](?=$| [A-Z0-9(\[`'\"])")


def boolean_flags(kind: type, prefix: str = "") -> dict[str, str | None]:
    """``--name`` -> ``--no-name`` of every boolean field of dataclass ``kind`` and the sections in it, named as
    tyro names them (``--checkpoint.async-save`` -> ``--checkpoint.no-async-save``); ``None`` for a flag made
    without a ``--no-`` form (``tyro.conf.FlagCreatePairsOff``), whose absence is its false."""
    no_pairs = typing.get_args(tyro.conf.FlagCreatePairsOff[bool])[1]
    flags: dict[str, str | None] = {}
    kind = typing.get_origin(kind) or kind  # a generic command, Command[Recipe], reads its class's hints
    hints = typing.get_type_hints(kind, include_extras=True)
    for field in dataclasses.fields(kind):
        hint = hints[field.name]
        name = field.name.replace("_", "-")
        extras = getattr(hint, "__metadata__", ())
        renamed = next((extra.name for extra in extras if getattr(extra, "name", None) is not None), None)
        hint = typing.get_args(hint)[0] if extras else hint
        if renamed is not None:
            name = renamed
        if hint is bool:
            flags[f"--{prefix}{name}"] = None if no_pairs in extras else f"--{prefix}no-{name}"
        elif dataclasses.is_dataclass(hint):
            flags.update(boolean_flags(hint, f"{prefix}{name}." if name else prefix))
    return flags


def option_names(kind: type, prefix: str = "") -> set[str]:
    """Every ``--option`` tyro makes of dataclass ``kind``'s fields and the sections in it (a boolean's ``--no-``
    form too), named as tyro names them."""
    names: set[str] = set()
    kind = typing.get_origin(kind) or kind
    hints = typing.get_type_hints(kind, include_extras=True)
    for field in dataclasses.fields(kind):
        hint = hints[field.name]
        extras = getattr(hint, "__metadata__", ())
        renamed = next((extra.name for extra in extras if getattr(extra, "name", None) is not None), None)
        name = field.name.replace("_", "-") if renamed is None else renamed
        hint = typing.get_args(hint)[0] if extras else hint
        if dataclasses.is_dataclass(hint):
            names |= option_names(hint, f"{prefix}{name}." if name else prefix)
        elif name:
            names.add(f"--{prefix}{name}")
    return names | {flag for flag in boolean_flags(kind, prefix).values() if flag is not None}


def check_options(argv: Sequence[str], known: set[str], prog: str) -> None:
    """Stop (``SystemExit(2)``, a few lines on stderr) at the first ``--option`` of ``argv`` that is none of
    ``known``, naming the closest known ones first."""
    for arg in argv:
        name = arg.partition("=")[0]
        if not name.startswith("--") or name in known or name.replace("_", "-") in known:
            continue
        close = difflib.get_close_matches(name.replace("_", "-"), sorted(known), n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        print(f"error: {prog} has no option {name}.{hint} ({prog} --help lists every option.)", file=sys.stderr)
        raise SystemExit(2)


def flags_from_values(argv: Sequence[str], flags: dict[str, str | None]) -> list[str]:
    """``argv`` with each boolean given a value (``--x True``, ``--x=false``) written as tyro's flag (``--x``,
    ``--no-x``), so command lines written for the older ``--flag VALUE`` form keep working."""
    out: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        name, _, value = arg.partition("=")
        name = name.replace("_", "-") if name.startswith("--") else name
        if name in flags and not value and index + 1 < len(argv) and argv[index + 1].lower() in _TRUE + _FALSE:
            value = argv[index + 1]
            index += 1
        if name in flags and value.lower() in _TRUE + _FALSE:
            flag = name if value.lower() in _TRUE else flags[name]
            out += [] if flag is None else [flag]
        else:
            out.append(arg)
        index += 1
    return out


def plain_help(text: str | None) -> str | None:
    """A docstring as help text: without the double backticks of code spans, and with the source's line breaks
    inside a paragraph joined."""
    if text is None:
        return None
    paragraphs = re.split(r"\n\s*\n", text.replace("``", ""))
    return "\n\n".join(" ".join(part.split()) for part in paragraphs)


class PlainHelpRegistry(ConstructorRegistry):
    """tyro's handling of dataclasses, with each field's help text passed through ``plain_help``."""

    def __init__(self) -> None:
        super().__init__()
        self._building = False
        self.struct_rule(self._plain_help_rule)

    def _plain_help_rule(self, info: StructTypeInfo) -> StructConstructorSpec | None:
        if self._building or not dataclasses.is_dataclass(info.type):
            return None
        self._building = True  # the default rules build the spec; this rule only edits its help
        try:
            spec = ConstructorRegistry.get_struct_spec(info)
        finally:
            self._building = False
        if not isinstance(spec, StructConstructorSpec):
            return None
        fields = tuple(dataclasses.replace(field, helptext=_plain(field.helptext)) for field in spec.fields)
        return dataclasses.replace(spec, fields=fields)


def _plain(helptext: str | Callable[[], str | None] | None) -> str | Callable[[], str | None] | None:
    if callable(helptext):
        return lambda: plain_help(helptext())
    return plain_help(helptext)


def parse_args(
    kind: type[Command], default: Command, argv: Sequence[str], prog: str, description: str, recipe_type: type
) -> Command:
    """``argv`` parsed by tyro into ``kind`` (the app's command dataclass) over ``default``.

    ``recipe_type`` is the class of its ``recipe`` field. A choice or value tyro refuses is reported on stderr
    with the usage, and raises ``SystemExit(2)``; ``--help`` prints every flag and raises ``SystemExit(0)``.
    """
    flags = {**boolean_flags(recipe_type), **boolean_flags(kind)}
    args = flags_from_values(argv, flags)
    check_options(args, {"--help", "-h", *option_names(recipe_type), *option_names(kind)}, prog)
    return tyro.cli(kind, default=default, args=args, prog=prog, description=description, registry=PlainHelpRegistry())


def split_lanes(argv: list[str]) -> list[str]:
    """``argv`` with a comma-separated ``--rehearse-lanes cpu,xla`` written as tyro reads it (``cpu xla``)."""
    out: list[str] = []
    for arg in argv:
        out += arg.split(",") if out[-1:] == ["--rehearse-lanes"] else [arg]
    return out
