"""A recipe's warmup for a shorter run: the schedule keeps its shape when only ``train.steps`` is lowered.

A recipe that sets ``train.warmup_steps`` (SFT's 30 of 300 steps, FLUX's 50 of 10,000) would refuse
``--train.steps 5``: warmup must end before the last step. A run shorter than its recipe's therefore warms up for
the same share of its steps, unless the warmup is set too (``--train.warmup-steps``, or ``warmup_steps`` beside
``steps`` in a recipe file). A recipe that leaves warmup unset already scales it (``min(10, steps // 10)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

Train = TypeVar("Train")


def scaled_warmup(train: Train, steps: int) -> Train:
    """``train`` (a ``TrainConfig``) for a run of ``steps`` steps: below its own ``steps``, a set warmup shrinks
    in proportion (``warmup_steps * steps // train.steps``); otherwise ``train`` with ``steps`` alone changed.

    A ``steps`` below 1 is left for ``TrainConfig`` to refuse, naming the field.
    """
    config: Any = train
    warmup = config.warmup_steps
    if steps < 1 or warmup is None or steps >= config.steps:
        return train
    return dataclasses.replace(config, steps=steps, warmup_steps=warmup * steps // config.steps)


def with_scaled_warmup(recipe: Any, steps: int) -> Any:
    """``recipe`` with its ``train`` section set for ``steps`` steps by ``scaled_warmup``."""
    train = scaled_warmup(recipe.train, steps)
    return recipe if train is recipe.train else dataclasses.replace(recipe, train=train)
