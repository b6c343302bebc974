"""The xla step's held-out evaluation: the model's cross-entropy on one batch as a forward-only program on
the step's mesh, reading the parameters where the step keeps them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from titanpod.graph.xla.mesh import replicated


def held_out_program(loss: Callable[..., Any], mesh: Any) -> Any:
    """``jax.jit`` of ``loss`` (the model's cross-entropy alone, ``titanpod.graph.xla.loss``) on the first
    micro-batch of placed batch arrays [1, ...]: (parameters list, *batch arrays) -> the loss, 0-d, replicated on
    ``mesh``. Compiled once per batch shape; the parameters are read, not donated."""
    import jax

    def evaluate(params: list[Any], *batch_ABS: Any) -> Any:
        return loss(params, *(array[0] for array in batch_ABS))[0]

    return jax.jit(evaluate, out_shardings=replicated(mesh))
