"""The blocks' loop for a step of several micro-batches: its backward adds each block's parameter gradient into
the step's running sum of gradients, in place, rather than handing out a gradient of its own.

Legend: L blocks.

A step of several micro-batches (``TrainConfig.grad_accum_steps``) sums their gradients. Summed after each
micro-batch's backward, the sum and that micro-batch's gradient are two fp32 copies of every parameter's
gradient at once; for the stacked blocks' parameters, most of a decoder's, ``summing_scan``'s backward reads the
sum as its loop's carry and adds block i's gradient into row i of it, so there is one copy. Its backward
recomputes each block from the block's input (what ``jax.checkpoint`` with ``nothing_saveable`` keeps) and takes
that block's ``jax.vjp``: the arithmetic of the plain loop's backward, one block at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Step = Callable[[Any, list[Any], list[Any]], tuple[Any, Any]]
"""``step(carry, slices, shared)``: one block on ``carry`` with its parameters ``slices`` (one row of each stacked
array) and the ``shared`` inputs every block reads -> (the next carry, what the block gives out besides it)."""


def summing_scan(
    step: Step, carry: Any, stacked: Sequence[Any], sums: Sequence[Any], shared: Sequence[Any]
) -> tuple[Any, Any]:
    """``jax.lax.scan`` of ``step`` over the rows of ``stacked`` ([L, ...] arrays) from ``carry``: (the last carry,
    each block's other output stacked [L, ...]), whose gradient with respect to ``stacked`` is ``sums`` (arrays
    shaped as ``stacked``) plus the true gradient. ``sums`` gets no gradient; ``shared`` (arrays) gets the sum over
    the blocks of each one's, its integer arrays none."""
    import jax
    import jax.numpy as jnp

    shared = list(shared)
    differentiable = [jnp.issubdtype(array.dtype, jnp.inexact) for array in shared]

    def with_floats(base: Sequence[Any], floats: Sequence[Any]) -> list[Any]:
        given = iter(floats)
        return [next(given) if flag else array for array, flag in zip(base, differentiable, strict=True)]

    def loop(stacked: list[Any], carry: Any, shared_now: list[Any]) -> tuple[Any, Any]:
        return jax.lax.scan(lambda inner, slices: step(inner, slices, shared_now), carry, stacked)

    @jax.custom_vjp
    def run(stacked: list[Any], sums: list[Any], carry: Any, shared_now: list[Any]) -> tuple[Any, Any]:
        return loop(stacked, carry, shared_now)

    def forward(stacked: list[Any], sums: list[Any], carry: Any, shared_now: list[Any]) -> tuple[Any, Any]:
        def body(inner: Any, slices: list[Any]) -> tuple[Any, Any]:
            following, out = step(inner, slices, shared_now)
            return following, (out, inner)

        last, (outs, inputs_L) = jax.lax.scan(body, carry, stacked)
        return (last, outs), (stacked, sums, inputs_L, shared_now)

    def backward(saved: tuple[Any, ...], cotangents: tuple[Any, Any]) -> tuple[Any, ...]:
        stacked, sums, inputs_L, shared_now = saved
        last_cotangent, outs_cotangent = cotangents
        floats = [array for array, flag in zip(shared_now, differentiable, strict=True) if flag]

        def block(slices: list[Any], block_input: Any, floats_now: list[Any]) -> tuple[Any, Any]:
            return step(block_input, slices, with_floats(shared_now, floats_now))

        def body(state: tuple[Any, list[Any], list[Any]], row: tuple[Any, Any, Any]) -> tuple[tuple, None]:
            carry_cotangent, running, floats_cotangent = state
            index, block_input, out_cotangent = row
            slices = [jax.lax.dynamic_index_in_dim(array, index, keepdims=False) for array in stacked]
            _, pullback = jax.vjp(block, slices, block_input, floats)
            slices_cotangent, input_cotangent, floats_part = pullback((carry_cotangent, out_cotangent))
            running = [
                jax.lax.dynamic_update_index_in_dim(
                    total, jax.lax.dynamic_index_in_dim(total, index, keepdims=False) + part, index, 0
                )
                for total, part in zip(running, slices_cotangent, strict=True)
            ]
            floats_cotangent = [a + b for a, b in zip(floats_cotangent, floats_part, strict=True)]
            return (input_cotangent, running, floats_cotangent), None

        layers = stacked[0].shape[0]
        start = (last_cotangent, list(sums), [jnp.zeros_like(array) for array in floats])
        rows = (jnp.arange(layers), inputs_L, outs_cotangent)
        (first_cotangent, running, floats_cotangent), _ = jax.lax.scan(body, start, rows, reverse=True)
        given = iter(floats_cotangent)
        shared_cotangent = [next(given) if flag else None for flag in differentiable]
        return running, None, first_cotangent, shared_cotangent

    run.defvjp(forward, backward)
    return run(list(stacked), list(sums), carry, shared)
