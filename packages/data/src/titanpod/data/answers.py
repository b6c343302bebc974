"""Verifiable answers: the last number a completion writes, checked against a reference.

A number is an optional minus sign, digits (commas between thousands allowed) and an optional
decimal part: ``-3``, ``1,024``, ``2.50``. Two numbers are equal when their values are, so ``2.50``
matches ``2.5`` and ``1,024`` matches ``1024``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
"""What counts as a number in a completion or a reference."""


def last_number(text: str) -> Decimal | None:
    """The value of the last number written in ``text``, or ``None`` when it writes none."""
    found = NUMBER.findall(text)
    if not found:
        return None
    try:
        return Decimal(found[-1].replace(",", ""))
    except InvalidOperation:  # the pattern only matches valid numbers; kept for safety of the conversion
        return None


def number_reward(prompt: str, completion: str, answer: str) -> float:
    """1.0 when the last number in ``completion`` equals the last number in ``answer`` (the reference, which
    may hold working before its result, e.g. ``... #### 42``), else 0.0; 0.0 when either writes no number."""
    got, want = last_number(completion), last_number(answer)
    return 1.0 if got is not None and want is not None and got == want else 0.0
