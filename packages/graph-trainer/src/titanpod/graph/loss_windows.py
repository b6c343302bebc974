"""The first and last loss of a run as a summary shows them: means over two windows of steps that never
overlap, so a short run's two figures are never the same steps."""

from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW = 10
"""The most steps a window covers."""


@dataclass(frozen=True)
class FirstLastMeans:
    """Means of a figure (a loss, a reward) over the first and the last ``size`` steps of a run."""

    size: int
    """Steps in each window: ``WINDOW``, or half the steps of a shorter run (rounded down)."""
    first: float
    """Mean of the first ``size`` steps."""
    last: float | None
    """Mean of the last ``size`` steps; ``None`` for a run of one step, which has only one figure."""


def first_last_means(values: list[float], window: int = WINDOW) -> FirstLastMeans | None:
    """The two windows of ``values`` (one per step, in order): ``min(window, len // 2)`` steps each, so they
    never share a step; ``None`` for no steps, and for one step a single window (``last`` is ``None``)."""
    if not values:
        return None
    if len(values) == 1:
        return FirstLastMeans(1, values[0], None)
    size = min(window, len(values) // 2)
    return FirstLastMeans(size, math.fsum(values[:size]) / size, math.fsum(values[-size:]) / size)
