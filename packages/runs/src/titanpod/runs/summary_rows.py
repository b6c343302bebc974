"""Rows every trainer's summary table shares: the first and last loss, and MFU with the peak it divides by."""

from __future__ import annotations

from titanpod.graph import TrainSummary, first_last_means


def loss_rows(losses: list[float]) -> list[tuple[str, str]]:
    """The summary's loss rows: ``("loss, first 10 steps (mean)", "5.8909")`` and the last window's; one row,
    ``("loss (only one step)", ...)``, for a run of one step; none without steps."""
    windows = first_last_means(losses)
    if windows is None:
        return []
    if windows.last is None:
        return [("loss (only one step)", f"{windows.first:.4f}")]
    steps = "step" if windows.size == 1 else f"{windows.size} steps"
    return [
        (f"loss, first {steps} (mean)", f"{windows.first:.4f}"),
        (f"loss, last {steps} (mean)", f"{windows.last:.4f}"),
    ]


def mfu_text(summary: TrainSummary) -> str:
    """``summary.mfu`` as a percentage, with where its peak comes from (``TrainSummary.peak_method``) and a
    pointer to the warning when it is above 100%."""
    text = f"{summary.mfu:.1%}"
    if summary.mfu > 1:
        text += " (above 100%: the peak is too low, see the warning)"
    return f"{text}; peak: {summary.peak_method}" if summary.peak_method else text
