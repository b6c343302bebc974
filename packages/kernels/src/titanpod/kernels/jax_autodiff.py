"""The pieces ``jax_op`` and the tpu lane's bridge share: gradients of a JAX function as a second
JAX function, and the autograd rule that calls it from PyTorch.

Legend: none; shapes belong to the wrapped function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def as_tuple(result: Any) -> tuple[Any, ...]:
    """A JAX function's result as a tuple of arrays (one array becomes a tuple of one)."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def floating_indices(tensors: Sequence[torch.Tensor]) -> list[int]:
    """Positions of the floating-point tensors: the inputs that receive gradients."""
    return [i for i, t in enumerate(tensors) if t.is_floating_point()]


def vjp_function(fn: Callable[..., Any], n_inputs: int, wrt: list[int]) -> Callable[..., tuple[Any, ...]]:
    """JAX function: (inputs..., output cotangents...) -> gradients of the ``wrt`` inputs."""
    import jax

    def vjp(*arrays: Any) -> tuple[Any, ...]:
        primals, cotangents = arrays[:n_inputs], arrays[n_inputs:]

        def of_wrt(*values: Any) -> Any:
            full = list(primals)
            for index, value in zip(wrt, values, strict=True):
                full[index] = value
            return fn(*full)

        out, pullback = jax.vjp(of_wrt, *(primals[i] for i in wrt))
        return pullback(tuple(cotangents) if isinstance(out, (tuple, list)) else cotangents[0])

    return vjp


def register_jax_autograd(
    forward_op: Any, backward: Callable[[list[torch.Tensor]], Sequence[torch.Tensor]], *, packed: bool
) -> None:
    """Give ``forward_op`` (a ``torch.library`` custom op returning a list of tensors) the gradient
    ``backward(inputs + output cotangents) -> gradients of the floating inputs``.

    ``packed``: the op takes its inputs as one list argument (``op([a, b])``) rather than as
    separate arguments (``op(a, b)``). Integer inputs receive no gradient; a missing output
    cotangent is zeros.
    """

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Sequence[torch.Tensor]) -> None:
        tensors = list(inputs[0]) if packed else list(inputs)
        ctx.save_for_backward(*tensors)
        ctx.output_like = [torch.empty_like(o, device="meta") for o in output]

    def gradients(ctx: Any, grads: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
        inputs = list(ctx.saved_tensors)
        cotangents = [
            g if g is not None else torch.zeros(like.shape, dtype=like.dtype, device=inputs[0].device)
            for g, like in zip(grads, ctx.output_like, strict=True)
        ]
        input_grads = iter(backward(inputs + cotangents))
        per_input = [next(input_grads) if t.is_floating_point() else None for t in inputs]
        return (per_input,) if packed else tuple(per_input)

    forward_op.register_autograd(gradients, setup_context=setup_context)
