"""The xla step's program: the optimizer and the whole step (forward, backward, gradient sum over the
micro-batches, clipping, AdamW) as JAX functions, and the ``jax.jit`` of that step.

Legend: A micro-batches per step, B batch, S sequence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from titanpod.graph.config import TrainConfig
from titanpod.graph.optimizer import AdamWState, adamw_update_, total_grad_norm
from titanpod.graph.xla.layer_stack import LayerStack
from titanpod.graph.xla.mesh import replicated
from titanpod.graph.xla.moment_pieces import Rows


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
    exp_avg: Sequence[Sequence[Any]],
    exp_avg_sq: Sequence[Sequence[Any]],
    count: Any,
    lr: Any,
    shardings: Sequence[Any],
    rows: Sequence[Rows],
    in_flight: int = 1,
) -> tuple[Any, ...]:
    """``update`` (``jax_adamw_update``'s) applied one piece at a time, for moments that live in host memory
    (``TrainConfig.optimizer_offload``) as pieces along each tensor's first axis (``rows``: each tensor's, see
    ``titanpod.graph.xla.moment_pieces``; ``exp_avg`` and ``exp_avg_sq`` hold each tensor's pieces). Each piece's
    moments come to the devices once the gradient norm is known and the new moments of the piece ``in_flight``
    pieces before are back on the host, and go back as soon as they are updated; the piece's rows of the parameter
    are updated in place. The devices then hold ``in_flight`` pieces' moments at a time rather than all of them
    (2: one piece comes in while the one before goes out, ``TrainConfig.optimizer_offload_overlap``); the
    arithmetic is the same as one ``update`` over every tensor. Returns what ``update`` returns, the new moments as
    pieces in host memory."""
    import jax

    grad_norm = jax_grad_norm(grads)
    new_params: list[Any] = []
    new_avg: list[list[Any]] = [[] for _ in params]
    new_avg_sq: list[list[Any]] = [[] for _ in params]
    # The pieces updated last, oldest first: (entry, its parameter after them, their new moments in host memory).
    landing: deque[tuple[int, Any, Any, Any]] = deque()
    step = applied = None
    for index, (param, grad, avgs, avg_sqs, sharding, pieces) in enumerate(
        zip(params, grads, exp_avg, exp_avg_sq, shardings, rows, strict=True)
    ):
        host = in_host_memory([sharding])[0]
        for (start, stop), avg, avg_sq in zip(pieces, avgs, avg_sqs, strict=True):
            # The barrier ties this piece's host copies to the piece in_flight pieces back having gone out, so at
            # most in_flight pieces' moments are on a device at once. (libtpu's memory-space assignment still starts
            # the first pieces' copies, the program's arguments, early where memory allows.)
            settled = landing.popleft() if len(landing) == in_flight else None
            avg, avg_sq, _, *waited = jax.lax.optimization_barrier((avg, avg_sq, grad_norm, *(settled or ())[1:]))
            if settled is not None:  # that piece's moments, as they left the barrier
                new_avg[settled[0]].append(waited[-2])
                new_avg_sq[settled[0]].append(waited[-1])
            avg, avg_sq = on_devices([avg, avg_sq], [sharding] * 2)
            whole = len(pieces) == 1
            (piece,), (avg,), (avg_sq,), step, _, applied = update(
                [param if whole else param[start:stop]],
                [grad if whole else grad[start:stop]],
                [avg],
                [avg_sq],
                count,
                lr,
                grad_norm=grad_norm,
                entries=[index],
            )
            param = piece if whole else jax.lax.dynamic_update_slice_in_dim(param, piece, start, axis=0)
            landing.append((index, param, jax.device_put(avg, host), jax.device_put(avg_sq, host)))
        new_params.append(param)
    for entry, _, avg, avg_sq in landing:
        new_avg[entry].append(avg)
        new_avg_sq[entry].append(avg_sq)
    return new_params, new_avg, new_avg_sq, step, grad_norm, applied


def jax_step(
    loss: Callable[..., Any],
    update: Callable[..., Any],
    param_shardings: Sequence[Any],
    moment_rows: Sequence[Rows] | None = None,
    in_flight: int = 1,
    summing_loss: Callable[..., Any] | None = None,
    stacked: Sequence[bool] = (),
) -> Callable[..., Any]:
    """The whole step as a JAX function (what is jitted): (params, exp_avg, exp_avg_sq, step,
    lr, tokens [A, B, S], labels [A, B, S][, document ids [A, B, S]]), or (..., lr, named tensors each
    [A, ...]) for batches of named tensors -> (params, exp_avg,
    exp_avg_sq, step, loss, grad_norm, applied, metrics summed over the micro-batches).

    ``loss`` is the model's (``titanpod.graph.xla.loss``), ``update`` the optimizer's (``jax_adamw_update``);
    the gradients are laid out as ``param_shardings``, the parameters' own. ``moment_rows``: the moments arrive in
    host memory (``TrainConfig.optimizer_offload``) as pieces, each tensor's first-axis ``Rows``, and are updated
    piece by piece (``streamed_update``, ``in_flight`` pieces on the devices at once), each moved to the devices
    and back; ``None``: they are on the devices. ``summing_loss``: ``loss`` taking the running sums of the
    gradients after the parameters (``jax_loss``'s ``gradient_sums``), used for a step of more than one
    micro-batch, whose blocks' loop then adds each micro-batch's gradient of the entries ``stacked`` flags into
    the sum in place (``titanpod.graph.xla.gradient_sums``)."""
    import jax
    import jax.numpy as jnp

    value_and_grad = jax.value_and_grad(loss, has_aux=True)
    summing_value_and_grad = jax.value_and_grad(summing_loss, has_aux=True) if summing_loss is not None else None
    shardings = param_shardings

    def sharded_like_params(arrays: list[Any]) -> list[Any]:  # gradients reduce-scatter, not all-reduce
        return jax.lax.with_sharding_constraint(arrays, shardings)

    def step(params, exp_avg, exp_avg_sq, count, lr, tokens_ABS, labels_ABS=None, document_ids_ABS=None):
        if isinstance(tokens_ABS, Mapping):  # named tensors, each [A, ...]
            scanned: tuple = (tokens_ABS,)
            micro_batches = next(iter(tokens_ABS.values())).shape[0]
        else:
            scanned = (
                (tokens_ABS, labels_ABS) if document_ids_ABS is None else (tokens_ABS, labels_ABS, document_ids_ABS)
            )
            micro_batches = tokens_ABS.shape[0]
        in_loop = summing_loss is not None and micro_batches > 1 and any(stacked)

        def micro_step(grad_sum, batch):
            if in_loop:  # the stacked entries' gradients come back already added to their sums
                (loss, metrics), grads = summing_value_and_grad(params, grad_sum, *batch)
                grads = sharded_like_params(grads)
                summed = [g if s_in else s + g for s, g, s_in in zip(grad_sum, grads, stacked, strict=True)]
                return summed, (loss, metrics)
            (loss, metrics), grads = value_and_grad(params, *batch)
            return [s + g for s, g in zip(grad_sum, sharded_like_params(grads), strict=True)], (loss, metrics)

        zeros = sharded_like_params([jnp.zeros(p.shape, jnp.float32) for p in params])
        grad_sum, (losses_A, metrics_A) = jax.lax.scan(micro_step, zeros, scanned)
        grads = [(g / micro_batches).astype(p.dtype) for g, p in zip(grad_sum, params, strict=True)]
        if moment_rows is not None:
            params, exp_avg, exp_avg_sq, count, grad_norm, applied = streamed_update(
                update, params, grads, exp_avg, exp_avg_sq, count, lr, shardings, moment_rows, in_flight
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
