"""The checks every config's values go through: type and range, each refusal naming the field."""

from __future__ import annotations

import pytest

from titanpod.models.field_checks import real_number, whole_number


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (True, "got True (bool)"),
        (4.0, "got 4.0 (with a decimal point): write steps = 4"),
        ("4", "got '4' (text): write the number without quotes"),
        (float("inf"), "got inf (a number past the float range"),
        (0, "must be at least 1, got 0"),
        (2**63, f"must fit in 64 bits (at most {2**63 - 1})"),
    ],
)
def test_a_whole_number_is_an_int_in_range(value, words):
    with pytest.raises(ValueError, match=r"^train\.steps must") as refusal:
        whole_number("train.steps", value, at_least=1)
    assert words in str(refusal.value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (float("nan"), "must be a finite number, got nan."),
        (-float("inf"), "must be a finite number, got -inf"),
        (10**400, "must be a finite number"),
        (False, "must be a number, got False"),
        (0.0, "must be above 0, got 0.0"),
    ],
)
def test_a_real_number_is_finite_and_in_range(value, words):
    with pytest.raises(ValueError, match=r"^train\.eps ") as refusal:
        real_number("train.eps", value, above=0)
    assert words in str(refusal.value)


def test_numbers_in_range_come_back_as_given():
    assert whole_number("data.seq_len", 2, at_least=2) == 2
    assert real_number("train.lr", 3, at_least=0) == 3
