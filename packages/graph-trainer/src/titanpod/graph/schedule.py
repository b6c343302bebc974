"""Learning-rate schedules: linear warmup, then cosine, linear or constant decay."""

from __future__ import annotations

import math

from titanpod.graph.config import TrainConfig


def lr_multiplier(step: int, config: TrainConfig) -> float:
    """Fraction of ``config.lr`` to use at ``step`` (1-based: the first update is step 1).

    Warmup rises linearly over ``resolved_warmup_steps`` to 1 (the last warmup step gets 1); decay
    then falls from 1 at that step to ``min_lr_ratio`` at the last step.
    """
    warmup = config.resolved_warmup_steps
    if step <= warmup:
        return step / warmup
    if config.decay == "constant":
        return 1.0
    progress = (step - warmup) / (config.steps - warmup)
    shape = 1.0 - progress if config.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * shape
