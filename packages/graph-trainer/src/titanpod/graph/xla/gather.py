"""FSDP's gather inside the xla step, as sharding constraints: each parameter laid out whole over the data
axes where a block uses it (its gradient reduce-scattered back), and a block's hidden states laid out as the
batch is."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from titanpod.graph.xla.remat import BlockGather


def fsdp_gather(
    model: nn.Module,
    plan: Any,
    mesh: Any,
    axes: Mapping[str, int],
    ndims: Mapping[str, int],
    homes: Mapping[str, Any],
    gather_dtype: torch.dtype | None,
) -> BlockGather | None:
    """FSDP's gather as sharding constraints: parameter ``name``'s JAX value cast to ``gather_dtype`` and laid
    out whole over the data shard axes (still split over ``tp``, experts over ``ep``); parameters a module gathers
    itself (``self_gathered``) only cast. ``None`` when nothing is sharded over a data axis. Without it XLA's
    partitioner may keep the weights sharded and split the activations' features to match, moving activations
    instead of weights.

    ``ndims``: each parameter's number of dimensions; ``homes``: each parameter's sharding where it is stored
    (a block's own, inside a stack)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    from titanpod.parallel.xla_executor import gathered_partition_spec

    if plan is None:
        return None
    own = self_gathered(model)
    targets = {
        name: homes[name] if name in own else NamedSharding(mesh, gathered_partition_spec(plan, name, ndim, axes))
        for name, ndim in ndims.items()
    }
    if all(target.spec == homes[name].spec for name, target in targets.items()):
        return None
    dtype = None if gather_dtype is None else jnp.dtype(str(gather_dtype).removeprefix("torch."))

    def gather(name: str, array: Any) -> Any:
        cast = dtype if dtype is not None and jnp.issubdtype(array.dtype, jnp.floating) else array.dtype
        stored = array.dtype

        @jax.custom_vjp
        def gathered(value: Any) -> Any:
            return jax.lax.with_sharding_constraint(value.astype(cast), targets[name])

        def forward(value: Any) -> tuple[Any, None]:
            return gathered(value), None

        def backward(_: None, grad: Any) -> tuple[Any]:
            # Reduce-scattered where the block's backward makes it, in the stored dtype: left to the
            # partitioner, the gradients stayed whole until the step's end (one block's worth a layer).
            return (jax.lax.with_sharding_constraint(grad.astype(stored), homes[name]),)

        gathered.defvjp(forward, backward)
        return gathered(array)

    return gather


def hidden_states_layout(mesh: Any, axes: Mapping[str, int]) -> Callable[[Any], Any] | None:
    """A block's hidden states [B, S, D] (what a recomputed block keeps of itself) laid out as the batch is: B
    over the data axes, S over ``cp``; ``None`` on a mesh without those axes. (Splitting S over ``tp`` as well,
    sequence parallelism, was tried: libtpu then gathered every block's input again and kept the copies,
    5 GiB a layer more for Llama 3 405B at fsdp 64 x tp 8.)"""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from titanpod.parallel.xla_executor import batch_partition_spec

    if not any(axes.get(axis, 1) > 1 for axis in ("dp_replicate", "fsdp", "ep", "cp")):
        return None
    spec = PartitionSpec(*batch_partition_spec(axes, 3))

    def layout(array: Any) -> Any:
        if array.ndim != 3:
            return array
        return jax.lax.with_sharding_constraint(array, NamedSharding(mesh, spec))

    return layout


def self_gathered(model: nn.Module) -> set[str]:
    """Names of the parameters whose module gathers them itself (its ``gathers_own_parameters``: MoE experts
    whose grouped-matmul kernel gathers their weights inside its ``shard_map``): FSDP's gather in the step
    leaves them as stored (cast to the gather dtype) rather than gather them twice."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        if getattr(module, "gathers_own_parameters", False):
            names.update(f"{prefix}.{name}" if prefix else name for name, _ in module.named_parameters())
    return names
