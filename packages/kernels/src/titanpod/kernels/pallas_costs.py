"""Cost estimates for Pallas kernels written by others: what a compiler's ``cost_analysis`` counts.

XLA counts a Pallas (Mosaic) kernel as exactly the ``pl.CostEstimate`` its ``pallas_call``
declares; without one the kernel adds nothing, and a step's compiled flops and estimated time
leave it out. titanpod's own kernels pass ``cost_estimate=``; a kernel from a library that
declares none (JAX's Splash attention) gets its estimates here: ``with_cost_estimates`` traces
the function's forward and its backward each to a jaxpr, sets the ``cost_estimate`` of every
``pallas_call`` in them from the kernel's name, and runs the jaxprs. Nothing else changes: the
same kernels run on the same values. Under ``jax.vmap`` Pallas multiplies a declared estimate
by the batch, so an estimate is for one unbatched call.

Legend: none; shapes belong to the wrapped function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CostOf = Callable[[str, Any], Any]
"""``(kernel name, pallas_call parameters) -> pl.CostEstimate`` of one kernel call; it raises
``KeyError`` for a kernel it does not know, so no kernel is left uncounted unnoticed."""


def with_cost_estimates(fn: Callable[..., Any], cost_of: CostOf) -> Callable[..., Any]:
    """``fn`` (JAX arrays in, a pytree of arrays out) with every Pallas call in its forward and
    its backward declaring ``cost_of(name, params)``.

    Differentiable in its floating-point arguments (a ``jax.custom_vjp``: the forward is
    ``jax.vjp`` of ``fn``, its pullback the residual, so no kernel runs twice); integer
    arguments (ids) receive no gradient.
    """
    import functools

    import jax
    import jax.numpy as jnp

    @functools.cache
    def differentiable_in(wrt: tuple[int, ...], n_args: int) -> Callable[..., Any]:
        @jax.custom_vjp
        def costed(*args: Any) -> Any:
            return _run_with_costs(fn, cost_of, *args)

        def vjp(*args: Any) -> tuple[Any, Any]:
            def of_floating(*values: Any) -> Any:
                full = list(args)
                for i, value in zip(wrt, values, strict=True):
                    full[i] = value
                return fn(*full)

            return jax.vjp(of_floating, *(args[i] for i in wrt))

        def forward(*args: Any) -> tuple[Any, Any]:
            return _run_with_costs(vjp, cost_of, *args)  # (outputs, the pullback: its residuals are arrays)

        def backward(pullback: Any, cotangent: Any) -> tuple[Any, ...]:
            grads = iter(_run_with_costs(lambda p, g: p(g), cost_of, pullback, cotangent))
            return tuple(next(grads) if i in wrt else None for i in range(n_args))

        costed.defvjp(forward, backward)
        return costed

    def call(*args: Any) -> Any:
        wrt = tuple(i for i, a in enumerate(args) if jnp.issubdtype(jnp.result_type(a), jnp.inexact))
        return differentiable_in(wrt, len(args))(*args)

    return call


def _run_with_costs(fn: Callable[..., Any], cost_of: CostOf, *args: Any) -> Any:
    """``fn(*args)``, staged to a jaxpr whose Pallas calls declare ``cost_of`` and run as such."""
    import jax
    from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    costed = ClosedJaxpr(_declare_costs(closed.jaxpr, cost_of), closed.consts)
    flat = jaxpr_as_fun(costed)(*jax.tree.leaves(args))
    return jax.tree.unflatten(jax.tree.structure(shapes), flat)


def _declare_costs(jaxpr: Any, cost_of: CostOf) -> Any:
    """``jaxpr`` with each ``pallas_call`` (in it or in the jaxprs its equations call) declaring ``cost_of``."""
    eqns = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            params = {**eqn.params, "cost_estimate": cost_of(eqn.params["name"], eqn.params)}
        else:
            params = {key: _in_param(value, cost_of) for key, value in eqn.params.items()}
        eqns.append(eqn.replace(params=params))
    return jaxpr.replace(eqns=eqns)


def _in_param(value: Any, cost_of: CostOf) -> Any:
    """An equation's parameter with the jaxprs in it (a jit's, a custom rule's, a branch tuple) costed."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    if isinstance(value, ClosedJaxpr):
        return ClosedJaxpr(_declare_costs(value.jaxpr, cost_of), value.consts)
    if isinstance(value, Jaxpr):
        return _declare_costs(value, cost_of)
    if isinstance(value, tuple) and any(isinstance(v, (ClosedJaxpr, Jaxpr)) for v in value):
        return tuple(_in_param(v, cost_of) for v in value)
    return value
