"""The xla step's program: the optimizer and the whole step (forward, backward, gradient sum over the
micro-batches, clipping, AdamW) as JAX functions, and the ``jax.jit`` of that step.

Legend: A micro-batches per step, B batch, S sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from titanpod.graph.config import TrainConfig
from titanpod.graph.optimizer import AdamWState, adamw_update_, total_grad_norm
from titanpod.graph.xla.layer_stack import LayerStack
from titanpod.graph.xla.mesh import replicated


def jax_adamw_update(
    names: Sequence[str], decays: Sequence[Any], layer_stack: LayerStack, config: TrainConfig
) -> Callable[..., Any]:
    """The optimizer as a JAX function: (params, grads, exp_avg, exp_avg_sq, step, lr) ->
    (params, exp_avg, exp_avg_sq, step, grad_norm, applied), running ``adamw_update_`` over the step's
    entries (``layer_stack``), each decayed as ``decays`` says of its model parameters (in ``names`` order)."""
    from torchax.interop import jax_view

    decays = layer_stack.per_entry(dict(zip(names, decays, strict=True)))

    def torch_update(params, grads, exp_avg, exp_avg_sq, step, lr):
        grad_norm = total_grad_norm(grads, foreach=False)  # torchax tensors have no foreach kernels
        state = AdamWState(step, list(exp_avg), list(exp_avg_sq))
        applied = adamw_update_(params, grads, state, lr, grad_norm, decays, config, implementation="per_tensor")
        return list(params), state.exp_avg, state.exp_avg_sq, state.step, grad_norm, applied

    return jax_view(torch_update)


def jax_step(
    loss: Callable[..., Any],
    update: Callable[..., Any],
    param_shardings: Sequence[Any],
    moments_on_host: bool = False,
) -> Callable[..., Any]:
    """The whole step as a JAX function (what is jitted): (params, exp_avg, exp_avg_sq, step,
    lr, tokens [A, B, S], labels [A, B, S][, document ids [A, B, S]]), or (..., lr, named tensors each
    [A, ...]) for batches of named tensors -> (params, exp_avg,
    exp_avg_sq, step, loss, grad_norm, applied, metrics summed over the micro-batches).

    ``loss`` is the model's (``titanpod.graph.xla.loss``), ``update`` the optimizer's (``jax_adamw_update``);
    the gradients are laid out as ``param_shardings``, the parameters' own. ``moments_on_host``: the moments
    arrive in host memory (``TrainConfig.optimizer_offload``) and are moved to the devices for the update; the
    jit's output shardings send the new ones back."""
    import jax
    import jax.numpy as jnp

    value_and_grad = jax.value_and_grad(loss, has_aux=True)
    shardings = param_shardings

    def sharded_like_params(arrays: list[Any]) -> list[Any]:  # gradients reduce-scatter, not all-reduce
        return jax.lax.with_sharding_constraint(arrays, shardings)

    def step(params, exp_avg, exp_avg_sq, count, lr, tokens_ABS, labels_ABS=None, document_ids_ABS=None):
        def micro_step(grad_sum, batch):
            (loss, metrics), grads = value_and_grad(params, *batch)
            return [s + g for s, g in zip(grad_sum, sharded_like_params(grads), strict=True)], (loss, metrics)

        zeros = sharded_like_params([jnp.zeros(p.shape, jnp.float32) for p in params])
        if isinstance(tokens_ABS, Mapping):  # named tensors, each [A, ...]
            scanned: tuple = (tokens_ABS,)
            micro_batches = next(iter(tokens_ABS.values())).shape[0]
        else:
            scanned = (
                (tokens_ABS, labels_ABS) if document_ids_ABS is None else (tokens_ABS, labels_ABS, document_ids_ABS)
            )
            micro_batches = tokens_ABS.shape[0]
        grad_sum, (losses_A, metrics_A) = jax.lax.scan(micro_step, zeros, scanned)
        grads = [(g / micro_batches).astype(p.dtype) for g, p in zip(grad_sum, params, strict=True)]
        if moments_on_host:
            exp_avg, exp_avg_sq = on_devices(exp_avg, shardings), on_devices(exp_avg_sq, shardings)
        params, exp_avg, exp_avg_sq, count, grad_norm, applied = update(params, grads, exp_avg, exp_avg_sq, count, lr)
        metrics = {name: jnp.sum(values_A) for name, values_A in metrics_A.items()}
        return params, exp_avg, exp_avg_sq, count, jnp.mean(losses_A), grad_norm, applied, metrics

    return step


def jit_step(
    step: Callable[..., Any], mesh: Any, param_shardings: Sequence[Any], moment_shardings: Sequence[Any]
) -> Any:
    """``jax.jit`` of ``step`` (``jax_step``); parameters and optimizer state are donated and keep their
    shardings (``param_shardings``, ``moment_shardings``), the rest of its outputs are replicated on ``mesh``."""
    import jax

    whole = replicated(mesh)
    out_shardings = (param_shardings, moment_shardings, moment_shardings, *[whole] * 5)
    return jax.jit(step, donate_argnums=(0, 1, 2, 3), out_shardings=out_shardings)


HOST_MEMORY = "pinned_host"
"""The memory kind AdamW's moments live in with ``TrainConfig.optimizer_offload``."""


def in_host_memory(shardings: Sequence[Any]) -> list[Any]:
    """``shardings`` with their arrays in the hosts' pinned memory (the same devices and layout)."""
    return [sharding.with_memory_kind(HOST_MEMORY) for sharding in shardings]


def on_devices(arrays: Sequence[Any], shardings: Sequence[Any]) -> list[Any]:
    """Inside the jitted step: ``arrays`` moved to device memory, laid out as ``shardings``."""
    import jax

    return [
        jax.device_put(array, sharding.with_memory_kind("device"))
        for array, sharding in zip(arrays, shardings, strict=True)
    ]
