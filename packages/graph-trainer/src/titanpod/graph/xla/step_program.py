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

    def torch_update(params, grads, exp_avg, exp_avg_sq, step, lr, grad_norm=None, entries=None):
        if grad_norm is None:
            grad_norm = total_grad_norm(grads, foreach=False)  # torchax tensors have no foreach kernels
        chosen = decays if entries is None else [decays[i] for i in entries]
        state = AdamWState(step, list(exp_avg), list(exp_avg_sq))
        applied = adamw_update_(params, grads, state, lr, grad_norm, chosen, config, implementation="per_tensor")
        return list(params), state.exp_avg, state.exp_avg_sq, state.step, grad_norm, applied

    return jax_view(torch_update)


def jax_grad_norm(grads: Sequence[Any]) -> Any:
    """The gradients' global L2 norm (0-d), computed as ``jax_adamw_update``'s update computes it."""
    from torchax.interop import jax_view

    return jax_view(lambda torch_grads: total_grad_norm(torch_grads, foreach=False))(list(grads))


def streamed_update(
    update: Callable[..., Any],
    params: Sequence[Any],
    grads: Sequence[Any],
    exp_avg: Sequence[Any],
    exp_avg_sq: Sequence[Any],
    count: Any,
    lr: Any,
    shardings: Sequence[Any],
) -> tuple[Any, ...]:
    """``update`` (``jax_adamw_update``'s) applied one tensor at a time, for moments that live in host memory
    (``TrainConfig.optimizer_offload``): each tensor's moments come to the devices once the gradient norm is known
    and the previous tensor's new moments are back on the host, and go back as soon as they are updated. The
    device then holds one tensor's moments at a time rather than all of them; the arithmetic is the same as one
    ``update`` over every tensor. Returns what ``update`` returns, the new moments in host memory."""
    import jax

    grad_norm = jax_grad_norm(grads)
    new_params: list[Any] = []
    new_avg: list[Any] = []
    new_avg_sq: list[Any] = []
    waits_for: tuple[Any, ...] = (grad_norm,)  # what the next tensor's moments may not be moved before
    step = applied = None
    for index, (param, grad, avg, avg_sq, sharding) in enumerate(
        zip(params, grads, exp_avg, exp_avg_sq, shardings, strict=True)
    ):
        # The barrier ties the host copies to the work before them: the compiler cannot start this tensor's
        # transfer early, nor finish the last one's late, so no two tensors' moments are on a device at once.
        avg, avg_sq, *waited = jax.lax.optimization_barrier((avg, avg_sq, *waits_for))
        if index:  # the previous tensor's moments, as they left the barrier
            new_avg.append(waited[-2])
            new_avg_sq.append(waited[-1])
        (avg, avg_sq), host = on_devices([avg, avg_sq], [sharding] * 2), in_host_memory([sharding])[0]
        (param,), (avg,), (avg_sq,), step, _, applied = update(
            [param], [grad], [avg], [avg_sq], count, lr, grad_norm=grad_norm, entries=[index]
        )
        new_params.append(param)
        waits_for = (param, jax.device_put(avg, host), jax.device_put(avg_sq, host))
    if params:
        new_avg.append(waits_for[-2])
        new_avg_sq.append(waits_for[-1])
    return new_params, new_avg, new_avg_sq, step, grad_norm, applied


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
    arrive in host memory (``TrainConfig.optimizer_offload``) and are updated tensor by tensor
    (``streamed_update``), each moved to the devices and back."""
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
            params, exp_avg, exp_avg_sq, count, grad_norm, applied = streamed_update(
                update, params, grads, exp_avg, exp_avg_sq, count, lr, shardings
            )
        else:
            params, exp_avg, exp_avg_sq, count, grad_norm, applied = update(
                params, grads, exp_avg, exp_avg_sq, count, lr
            )
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
