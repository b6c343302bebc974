"""The xla lane's training step: the whole step as one ``jax.jit`` program, through torchax.

Legend: A micro-batches per step, B batch, S sequence.

The model's torch ``loss`` runs as a JAX function (``torchax.interop.jax_view`` of a
``torch.func.functional_call``); ``jax.value_and_grad`` differentiates it, a ``lax.scan``
sums the gradients of the A micro-batches, and the optimizer is the torch lanes' own
functional AdamW (``adamw_update_``), also run through ``jax_view``, so every lane does
the same arithmetic. Parameters and AdamW moments live on the JAX devices as arrays
sharded by the plan (``titanpod.parallel.xla_executor``); XLA's SPMD partitioner adds
the gathers and gradient reductions. Parameters and state are donated to the program,
so a step updates them in place. jax and torchax are imported only when a step is built.
Batches may carry document ids (3-tuples, see ``titanpod.graph.steps.Batch``): they are one
more [A, B, S] input, sharded like the tokens, scanned with them and passed to ``model.loss``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from titanpod.device import Backend
from titanpod.graph.binding import parameters_bound
from titanpod.graph.config import TrainConfig
from titanpod.graph.loss_metrics import loss_and_metrics
from titanpod.graph.optimizer import AdamWState, adamw_update_, state_tree, total_grad_norm
from titanpod.graph.steps import Batch, StepOutput, TrainStep, stack_micro_batches

REMAT_POLICIES = {
    "save": None,
    "recompute": "nothing_saveable",
    "selective": "dots_with_no_batch_dims_saveable",
    "offload": "offload_dot_with_no_batch_dims",
}
"""``TrainConfig.memory_policy`` -> the ``jax.checkpoint_policies`` entry each transformer block is
rematerialised with (None: no rematerialisation). ``selective`` keeps the projections' matmul
outputs (dots without batch dimensions) and recomputes the rest, attention scores included:
those are [B, H, S, S], the largest activation, which is why ``dots_saveable`` is not used.
``offload`` moves those same matmul outputs to pinned host memory instead of keeping them."""


class XlaStep(TrainStep):
    """One optimizer step as a single ``jax.jit`` program: forward, backward, gradient sum, clipping, AdamW.

    ``plan`` (a ``titanpod.parallel.ShardingPlan``) and ``axes`` (mesh axis -> size) shard
    parameters, moments and batches over ``mesh`` (built from ``axes`` when not given);
    with no plan every array is replicated on a one-device mesh. The program is compiled
    on the first call and again only when the batch shape changes. The torch model's
    parameters are not updated while training: ``finish()`` copies the trained values back.
    ``state`` holds the AdamW moments and step count as jax arrays, sharded like the parameters.
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        backend: Backend,
        plan: Any = None,
        axes: Mapping[str, int] | None = None,
        mesh: Any = None,
    ) -> None:
        self.names = [name for name, _ in model.named_parameters()]
        self.axes = dict(axes or {})
        self.policy = _remat_policy(config.memory_policy)
        self._plan, self._mesh = plan, mesh
        super().__init__(model, config, backend)  # calls initial_state: parameters and moments on the mesh
        self.program = self.jitted_step()
        """The ``jax.jit`` of the step; it compiles on the first call, and again only for a new batch shape."""

    def initial_state(self) -> AdamWState:
        """Place the parameters on the mesh (``jax_params``) and make zero moments sharded like them."""
        with self.backend.runtime():
            self.mesh = self._mesh if self._mesh is not None else _default_mesh(self.backend, self.axes)
            named = list(zip(self.names, self.params, strict=True))
            self.jax_params = _place_params(named, self._plan, self.mesh, self.axes)
            self.param_shardings = [array.sharding for array in self.jax_params]
            return AdamWState(  # type: ignore[arg-type]  # jax arrays in the torch lanes' container
                step=_zeros((), self._replicated()),
                exp_avg=[_zeros(p.shape, s) for p, s in zip(self.params, self.param_shardings, strict=True)],
                exp_avg_sq=[_zeros(p.shape, s) for p, s in zip(self.params, self.param_shardings, strict=True)],
            )

    def _replicated(self) -> Any:
        from jax.sharding import NamedSharding, PartitionSpec

        return NamedSharding(self.mesh, PartitionSpec())

    def batch_sharding(self) -> Any:
        """The sharding of a step's tokens [A, B, S]: B split over the mesh's data axes."""
        from jax.sharding import NamedSharding, PartitionSpec

        from titanpod.parallel.xla_executor import batch_partition_spec

        return NamedSharding(self.mesh, PartitionSpec(None, *batch_partition_spec(self.axes, 2)))

    def loss_function(self) -> Callable[..., Any]:
        """The model's loss as a JAX function of (parameters list, tokens [B, S], labels [B, S][, document ids [B, S]]),
        returning (loss, metrics): the figures the model reports beside it (``titanpod.graph.loss_metrics``).

        Runs ``model.loss`` through ``jax_view`` of ``torch.func.functional_call``, under
        torchax's bf16 autocast when ``config.precision`` is bf16 (matmuls in bf16;
        parameters and gradients stay fp32), with each transformer block rematerialised
        by the memory policy.
        """
        from torchax.interop import jax_view

        model, names, config = self.model, self.names, self.config
        wrapper = _LossModule(model)

        def torch_loss(
            params: list[torch.Tensor],
            tokens_BS: torch.Tensor,
            labels_BS: torch.Tensor,
            document_ids_BS: torch.Tensor | None = None,
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            bound = {"inner." + name: param for name, param in zip(names, params, strict=True)}
            inputs = (tokens_BS, labels_BS) if document_ids_BS is None else (tokens_BS, labels_BS, document_ids_BS)
            with contextlib.ExitStack() as stack:
                if config.precision == "bf16":
                    stack.enter_context(_bf16_autocast())
                if self.policy is not None:
                    stack.enter_context(_rematerialised_blocks(wrapper, self.policy))
                return torch.func.functional_call(wrapper, bound, inputs)

        return jax_view(torch_loss)

    def update_function(self) -> Callable[..., Any]:
        """The optimizer as a JAX function: (params, grads, exp_avg, exp_avg_sq, step, lr) ->
        (params, exp_avg, exp_avg_sq, step, grad_norm, applied), running ``adamw_update_``."""
        from torchax.interop import jax_view

        decays, config = self.decays, self.config

        def torch_update(params, grads, exp_avg, exp_avg_sq, step, lr):
            grad_norm = total_grad_norm(grads, foreach=False)  # torchax tensors have no foreach kernels
            state = AdamWState(step, list(exp_avg), list(exp_avg_sq))
            applied = adamw_update_(params, grads, state, lr, grad_norm, decays, config)  # in place, functionalised
            return list(params), state.exp_avg, state.exp_avg_sq, state.step, grad_norm, applied

        return jax_view(torch_update)

    def step_function(self) -> Callable[..., Any]:
        """The whole step as a JAX function (what is jitted): (params, exp_avg, exp_avg_sq, step,
        lr, tokens [A, B, S], labels [A, B, S][, document ids [A, B, S]]) -> (params, exp_avg,
        exp_avg_sq, step, loss, grad_norm, applied, metrics summed over the micro-batches)."""
        import jax
        import jax.numpy as jnp

        value_and_grad = jax.value_and_grad(self.loss_function(), has_aux=True)
        update = self.update_function()
        shardings = self.param_shardings

        def sharded_like_params(arrays: list[Any]) -> list[Any]:  # gradients reduce-scatter, not all-reduce
            return jax.lax.with_sharding_constraint(arrays, shardings)

        def step(params, exp_avg, exp_avg_sq, count, lr, tokens_ABS, labels_ABS, document_ids_ABS=None):
            def micro_step(grad_sum, batch):
                (loss, metrics), grads = value_and_grad(params, *batch)
                return [s + g for s, g in zip(grad_sum, sharded_like_params(grads), strict=True)], (loss, metrics)

            zeros = sharded_like_params([jnp.zeros(p.shape, jnp.float32) for p in params])
            scanned = (
                (tokens_ABS, labels_ABS) if document_ids_ABS is None else (tokens_ABS, labels_ABS, document_ids_ABS)
            )
            grad_sum, (losses_A, metrics_A) = jax.lax.scan(micro_step, zeros, scanned)
            micro_batches = tokens_ABS.shape[0]
            grads = [(g / micro_batches).astype(p.dtype) for g, p in zip(grad_sum, params, strict=True)]
            params, exp_avg, exp_avg_sq, count, grad_norm, applied = update(
                params, grads, exp_avg, exp_avg_sq, count, lr
            )
            metrics = {name: jnp.sum(values_A) for name, values_A in metrics_A.items()}
            return params, exp_avg, exp_avg_sq, count, jnp.mean(losses_A), grad_norm, applied, metrics

        return step

    def jitted_step(self) -> Any:
        """``jax.jit`` of ``step_function``; parameters and optimizer state are donated and keep their shardings."""
        import jax

        replicated = self._replicated()
        out_shardings = (
            self.param_shardings,
            self.param_shardings,
            self.param_shardings,
            replicated,
            replicated,
            replicated,
            replicated,
            replicated,
        )
        return jax.jit(self.step_function(), donate_argnums=(0, 1, 2, 3), out_shardings=out_shardings)

    def place_batch(self, micro_batches: list[Batch]) -> tuple[Any, ...]:
        """Stack the micro-batches to tokens and labels [A, B, S] (and document ids, when the
        batches are 3-tuples) and put them on the mesh, each sharded like the tokens."""
        import jax

        sharding = self.batch_sharding()
        stacked = [t for t in stack_micro_batches(micro_batches) if t is not None]
        return tuple(jax.device_put(np.asarray(t.cpu()), sharding) for t in stacked)

    def _arguments(self, micro_batches: list[Batch], lr: float) -> tuple:
        import jax

        batch_arrays = self.place_batch(micro_batches)
        lr_array = jax.device_put(np.float32(lr), self._replicated())  # an argument, so no recompile per lr
        state = self.state
        return (self.jax_params, state.exp_avg, state.exp_avg_sq, state.step, lr_array, *batch_arrays)

    def lower(self, micro_batches: list[Batch], lr: float = 0.0) -> Any:
        """The step's ``jax.stages.Lowered`` for batches like ``micro_batches`` (for its HLO, cost and memory)."""
        import jax

        with self.backend.runtime(), jax.set_mesh(self.mesh):
            return self.program.lower(*self._arguments(micro_batches, lr))

    def __call__(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        import jax

        # The mesh in context: kernels (titanpod.kernels' jax_op) split their Pallas calls over it.
        with self.backend.runtime(), jax.set_mesh(self.mesh):
            outputs = self.program(*self._arguments(micro_batches, lr))
        self.jax_params, exp_avg, exp_avg_sq, step, loss, grad_norm, applied, metrics = outputs
        self.state = AdamWState(step, exp_avg, exp_avg_sq)
        return StepOutput(loss, grad_norm, applied, metrics)

    def state_tree(self) -> dict:
        """The step's parameters and AdamW state as the trainer-state checkpoint layout, holding its jax arrays:
        ``{"model": {name: array}, "optim": {"step": array, "exp_avg": {name: array}, "exp_avg_sq": {name: array}}}``.

        The arrays are the step's own, sharded on its mesh; the next step donates them, so save
        them (or copy them) before stepping again. The xla step uses no random state: no "rng" key.
        """
        return state_tree(self.names, self.jax_params, self.state)

    def load_state_tree(self, tree: dict) -> None:
        """Put a ``state_tree``-layout ``tree`` of arrays (jax or numpy) into the step, each on the step's own sharding.

        Every entry of ``state_tree()`` must be there with the same shape and dtype (an "rng"
        entry, if any, is ignored); a missing, unexpected or mismatched entry raises
        ``ValueError`` naming it. The step gets its own copies: ``tree`` stays valid after the next step.
        """
        import jax

        def flat(node: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
            if not isinstance(node, Mapping):
                return {prefix: node}
            return {path: leaf for key, child in node.items() for path, leaf in flat(child, (*prefix, key)).items()}

        def show(paths: list[tuple[str, ...]]) -> str:
            return ", ".join(" / ".join(path) for path in paths[:5]) + (
                f" and {len(paths) - 5} more" if len(paths) > 5 else ""
            )

        wanted = flat(self.state_tree())
        given = flat({key: value for key, value in tree.items() if key != "rng"})
        missing, unexpected = sorted(set(wanted) - set(given)), sorted(set(given) - set(wanted))
        if missing or unexpected:
            raise ValueError(
                f"The state tree does not match the step: missing [{show(missing)}], unexpected [{show(unexpected)}]."
            )
        for path, array in wanted.items():
            got = given[path]
            if tuple(got.shape) != tuple(array.shape) or np.dtype(got.dtype) != np.dtype(array.dtype):
                raise ValueError(
                    f"{' / '.join(path)} is {np.dtype(got.dtype)}{list(got.shape)} in the state tree; "
                    f"the step holds {np.dtype(array.dtype)}{list(array.shape)}."
                )
        with self.backend.runtime():
            placed = {
                path: jax.device_put(given[path], array.sharding, may_alias=False) for path, array in wanted.items()
            }
        self.jax_params = [placed["model", name] for name in self.names]
        self.state = AdamWState(  # type: ignore[arg-type]  # jax arrays in the torch lanes' container
            step=placed["optim", "step"],
            exp_avg=[placed["optim", "exp_avg", name] for name in self.names],
            exp_avg_sq=[placed["optim", "exp_avg_sq", name] for name in self.names],
        )

    def finish(self) -> None:
        """Copy the trained parameters from the JAX devices into the torch model (waits for the device)."""
        with torch.no_grad():
            for param, array in zip(self.params, self.jax_params, strict=True):
                param.data.copy_(torch.from_numpy(np.array(array)))  # np.array: a writable host copy


class _LossModule(nn.Module):
    """``model.loss`` and its metrics as a module's forward, for ``torch.func.functional_call``."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(
        self, tokens_BS: torch.Tensor, labels_BS: torch.Tensor, document_ids_BS: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if document_ids_BS is None:
            return loss_and_metrics(self.inner, tokens_BS, labels_BS)
        return loss_and_metrics(self.inner, tokens_BS, labels_BS, document_ids_BS=document_ids_BS)


@contextlib.contextmanager
def _bf16_autocast() -> Iterator[None]:
    """torchax's bf16 autocast (the op lists of ``torch.autocast``), while a step is traced.

    torchax 0.0.14's "promote" cast reads the dtype of every positional argument, so it
    fails on ``cat`` and ``stack`` (their first argument is a list of tensors). Those two
    promote mixed dtypes by themselves (to the widest, as the cast would), so their entries
    are left out of the table while tracing and put back after.
    """
    import torchax
    from torchax import amp

    aten = torch.ops.aten
    removed = {
        op: amp.autocast_policy.pop(op) for op in (aten.cat.default, aten.stack.default) if op in amp.autocast_policy
    }
    try:
        with amp.autocast("jax", torch.bfloat16, torchax.default_env()):
            yield
    finally:
        amp.autocast_policy.update(removed)


def _remat_policy(memory_policy: str) -> Any:
    """The ``jax.checkpoint`` policy for ``memory_policy`` (None for ``save``)."""
    name = REMAT_POLICIES[memory_policy]
    if name is None:
        return None
    import jax

    policies = jax.checkpoint_policies
    if memory_policy == "offload":
        if not _has_pinned_host():
            raise ValueError(
                "memory_policy='offload' on the xla lane offloads to pinned host memory, which this JAX backend "
                f"({jax.default_backend()}) does not have; run it on TPU or GPU, or use memory_policy='recompute' "
                "(or 'selective') here."
            )
        return policies.offload_dot_with_no_batch_dims("device", "pinned_host")
    return getattr(policies, name)


def _has_pinned_host() -> bool:
    import jax

    device = jax.devices()[0]
    try:
        kinds = {memory.kind for memory in device.addressable_memories()}
    except Exception:
        return False
    return "pinned_host" in kinds


@contextlib.contextmanager
def _rematerialised_blocks(wrapper: _LossModule, policy: Any) -> Iterator[None]:
    """While tracing, run each transformer block (``layers.<i>``) under ``jax.checkpoint(policy)``.

    A block's inputs are what the backward keeps of it (plus what ``policy`` saves); its
    other activations are recomputed in the backward, one block at a time, as the torch
    lanes' policies do. A model without ``layers`` is rematerialised as a whole.
    """
    blocks = getattr(wrapper.inner, "layers", None)
    targets: list[nn.Module] = list(blocks) if isinstance(blocks, nn.ModuleList) else [wrapper]
    originals = {id(block): block.__dict__.get("forward") for block in targets}
    try:
        for block in targets:
            block.forward = _checkpointed_forward(block, block.forward, policy)  # type: ignore[method-assign]
        yield
    finally:
        for block in targets:
            original = originals[id(block)]
            if original is None:
                del block.forward
            else:
                block.forward = original  # type: ignore[method-assign]


def _checkpointed_forward(block: nn.Module, forward: Callable[..., Any], policy: Any) -> Callable[..., Any]:
    """``forward`` of ``block`` as a torch callable that runs under ``jax.checkpoint``: the block's
    parameters and tensor arguments go in as JAX values, other arguments are closed over."""
    import jax
    from torch.utils import _pytree as pytree
    from torchax.interop import jax_view, torch_view

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        params = [p for _, p in block.named_parameters()]  # the tensors functional_call bound
        leaves, tree = pytree.tree_flatten((args, kwargs))
        is_tensor = [isinstance(leaf, torch.Tensor) for leaf in leaves]

        def body(params_j: list[Any], tensors_j: list[Any]) -> Any:
            tensors = iter(torch_view(tensors_j))
            full = [next(tensors) if flag else leaf for leaf, flag in zip(leaves, is_tensor, strict=True)]
            call_args, call_kwargs = pytree.tree_unflatten(full, tree)
            with parameters_bound(block, torch_view(params_j)):
                return jax_view(forward(*call_args, **call_kwargs))

        tensors = [leaf for leaf, flag in zip(leaves, is_tensor, strict=True) if flag]
        return torch_view(jax.checkpoint(body, policy=policy)(jax_view(params), jax_view(tensors)))

    return checkpointed


def _default_mesh(backend: Backend, axes: Mapping[str, int]) -> Any:
    """The mesh over ``axes`` (axes of size 1 dropped); one device when no axis splits anything."""
    import jax

    split = {name: size for name, size in axes.items() if size > 1}
    if split:
        return backend.build_mesh(split)
    return jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("replica",))


def _place_params(named: list[tuple[str, torch.Tensor]], plan: Any, mesh: Any, axes: Mapping[str, int]) -> list:
    """The parameters as jax arrays on ``mesh``: sharded by ``plan`` (``place_params``), or replicated without one."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    if plan is None:
        replicated = NamedSharding(mesh, PartitionSpec())
        return [jax.device_put(np.asarray(p.detach().cpu()), replicated) for _, p in named]
    from titanpod.parallel.xla_executor import place_params

    placed = place_params(dict(named), plan, mesh, axes)
    return [placed[name] for name, _ in named]


def _zeros(shape: tuple[int, ...] | torch.Size, sharding: Any) -> Any:
    """An fp32 jax array of zeros, made in place on the devices of ``sharding``."""
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda: jnp.zeros(tuple(shape), jnp.float32), out_shardings=sharding)()
