"""A summary's first and last loss are means over windows that never share a step."""

from __future__ import annotations

import pytest

from titanpod.graph import first_last_means
from titanpod.runs.summary_rows import loss_rows


def test_a_long_run_takes_ten_steps_at_each_end():
    means = first_last_means([float(step) for step in range(1, 101)])
    assert (means.size, means.first, means.last) == (10, pytest.approx(5.5), pytest.approx(95.5))


@pytest.mark.parametrize(("steps", "size"), [(2, 1), (3, 1), (5, 2), (10, 5), (19, 9), (20, 10)])
def test_a_short_run_splits_its_steps_so_the_windows_do_not_overlap(steps, size):
    losses = [float(step) for step in range(steps)]
    means = first_last_means(losses)
    assert means.size == size and 2 * size <= steps
    assert means.first == pytest.approx(sum(losses[:size]) / size)
    assert means.last == pytest.approx(sum(losses[-size:]) / size)
    assert means.first != means.last


def test_one_step_has_one_figure_and_says_so():
    assert first_last_means([3.0]).last is None
    assert loss_rows([3.0]) == [("loss (only one step)", "3.0000")]
    assert loss_rows([]) == []


def test_the_rows_name_the_window():
    assert loss_rows([4.0, 2.0]) == [("loss, first step (mean)", "4.0000"), ("loss, last step (mean)", "2.0000")]
    rows = loss_rows([6.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    assert rows == [("loss, first 3 steps (mean)", "5.0000"), ("loss, last 3 steps (mean)", "2.0000")]
