"""Environment markers (PEP 508) evaluated for a machine other than this one: the TPU VM a wheelhouse is for.

``uv export`` writes a requirement such as ``contourpy==1.3.3 ; python_full_version < '3.12'``; which lines the
VM needs depends on the VM's Python and platform, not on the machine that builds the wheelhouse. Standard
library only, so the wheelhouse builder runs with any Python 3.11+.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VERSION_VARIABLES = {"python_version", "python_full_version", "implementation_version"}
"""Variables compared as release numbers (``3.11`` < ``3.12`` < ``3.13``), not as strings."""

TOKEN = re.compile(r"\s*(?:(?P<str>'[^']*'|\"[^\"]*\")|(?P<op>==|!=|<=|>=|<|>|~=|\(|\))|(?P<word>[A-Za-z_.]+))")


@dataclass(frozen=True)
class Target:
    """The machine a wheelhouse is for: its Python release and platform."""

    python: str = "3.11"
    """``MAJOR.MINOR`` (a full version such as ``3.11.9`` also works)."""
    machine: str = "x86_64"

    def variables(self) -> dict[str, str]:
        """The marker variables of a CPython on Linux with this release and machine."""
        full = self.python if self.python.count(".") >= 2 else f"{self.python}.0"
        return {
            "python_version": ".".join(self.python.split(".")[:2]),
            "python_full_version": full,
            "implementation_version": full,
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "platform_machine": self.machine,
            "sys_platform": "linux",
            "os_name": "posix",
            "platform_system": "Linux",
        }


def _release(version: str) -> tuple[int, ...]:
    """``'3.11'`` -> ``(3, 11, 0)``: release numbers padded to three, for comparisons."""
    numbers = [int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(numbers + [0] * (3 - len(numbers)))


def _compare(left: str, op: str, right: str, as_version: bool) -> bool:
    if op in {"in", "not in"}:
        return (left in right) == (op == "in")
    if as_version:
        a, b = _release(left), _release(right)
    else:
        a, b = left, right
    if op == "~=":
        return a >= b and a[:1] == b[:1]
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _tokens(marker: str) -> list[str]:
    found, position = [], 0
    while position < len(marker.rstrip()):
        match = TOKEN.match(marker, position)
        if not match:
            raise ValueError(f"cannot read the marker {marker!r} at {marker[position:]!r}")
        found.append(match.group().strip())
        position = match.end()
    return found


def evaluate(marker: str, target: Target) -> bool:
    """Whether ``marker`` holds on ``target``; an unknown variable is an error that names it."""
    variables = target.variables()
    tokens = _tokens(marker)
    position = 0

    def take() -> str:
        nonlocal position
        position += 1
        return tokens[position - 1]

    def value() -> tuple[str, bool]:
        token = take()
        if token[0] in "'\"":
            return token[1:-1], False
        if token not in variables:
            raise ValueError(f"the marker {marker!r} uses {token!r}, which the wheelhouse's target does not define")
        return variables[token], token in VERSION_VARIABLES

    def comparison() -> bool:
        if tokens[position] == "(":
            take()
            result = disjunction()
            if take() != ")":
                raise ValueError(f"unbalanced parentheses in the marker {marker!r}")
            return result
        left, left_version = value()
        op = take()
        if op == "not":
            op = "not " + take()
        right, right_version = value()
        return _compare(left, op, right, left_version or right_version)

    def conjunction() -> bool:
        result = comparison()
        while position < len(tokens) and tokens[position] == "and":
            take()
            result = comparison() and result
        return result

    def disjunction() -> bool:
        result = conjunction()
        while position < len(tokens) and tokens[position] == "or":
            take()
            result = conjunction() or result
        return result

    result = disjunction()
    if position != len(tokens):
        raise ValueError(f"cannot read the marker {marker!r} past {' '.join(tokens[:position])!r}")
    return result
