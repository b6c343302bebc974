"""The idle share of a pipelined step: the schedule's warm-up and drain, when some stages have nothing to do."""

from __future__ import annotations

from titanpod.parallel.torch_executor import PipelineLayout


def pipeline_bubble(layout: PipelineLayout) -> float:
    """Fraction of a step each rank idles under ``layout``: ``(pp - 1) / (m x v + pp - 1)`` for m micro-batches
    and v stages a rank (Narayanan et al. 2021: interleaving v stages a rank divides the bubble by v)."""
    work = layout.microbatches * layout.stages_per_rank
    return (layout.pp - 1) / (work + layout.pp - 1)
