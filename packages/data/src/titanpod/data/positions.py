"""A saved data position this run's data cannot reach: refused when it is taken back, before a batch is cut.

A loader's position is counts (an epoch, a batch index within it); ``trainer.json``'s own check holds them to
non-negative integers, and the loader, which knows how many batches an epoch of its data gives, holds them to what
it can serve. A batch index past the end of an epoch would otherwise cut empty batches, and fail inside the model.
"""

from __future__ import annotations

from typing import Any


class DataPositionError(ValueError):
    """A saved data position holds ``value`` in ``field`` where this run's data can only reach ``expected``."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        super().__init__(f"{field} is {value!r}; it must be {expected}")
        self.field, self.value, self.expected = field, value, expected

    def inside(self, outer: str) -> DataPositionError:
        """The same error for a position saved inside another's, under ``outer``."""
        return DataPositionError(f"{outer}.{self.field}", self.value, self.expected)


def check_batch_index(index: Any, batches_per_epoch: int) -> None:
    """``DataPositionError`` when the saved batch ``index`` is past the end of an epoch of ``batches_per_epoch``
    batches (``index == batches_per_epoch`` is an epoch just finished: the next batch starts the next one)."""
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index <= batches_per_epoch:
        return
    raise DataPositionError(
        "index", index, f"0 to {batches_per_epoch} (this run's data gives {batches_per_epoch} batches an epoch)"
    )
