"""The xla step's state on the JAX devices: parameters placed by the plan, AdamW moments sharded like
them, and that state as the trainer-state tree, out and back in.

The tree is ``titanpod.graph.optimizer.state_tree``'s layout, holding jax arrays::

    {"model": {name: array}, "optim": {"step": array, "exp_avg": {name: array}, "exp_avg_sq": {name: array}}}

The xla step uses no random state: its tree has no "rng" entry, and one given to it is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from titanpod.graph.optimizer import AdamWState
from titanpod.graph.step_state import check_tree_matches, flatten_tree
from titanpod.graph.xla.mesh import replicated
from titanpod.graph.xla.moment_pieces import Rows, zero_pieces

RegionValues = Callable[[str, tuple[slice, ...]], torch.Tensor]
"""``values(name, region)``: the values of parameter ``name`` over ``region`` (one slice per dimension), on the CPU."""


def place_params(
    named: list[tuple[str, torch.Tensor]],
    plan: Any,
    mesh: Any,
    axes: Mapping[str, int],
    initial_values: RegionValues | None = None,
) -> list:
    """The parameters as jax arrays on ``mesh``: sharded by ``plan`` (``place_params``), or replicated without one.

    Parameters on the meta device are made there already sharded, each device's shard from
    ``initial_values(name, region)`` (``titanpod.parallel.xla_executor.create_params``): never whole on the host.
    """
    import jax

    on_meta = [name for name, p in named if p.is_meta]
    if on_meta:
        if initial_values is None:
            raise ValueError(
                f"{len(on_meta)} parameters are on the meta device (e.g. {on_meta[0]}) and the xla step was given no "
                "initial_values: pass initial_values (e.g. titanpod.models.region_initializer(model, seed)) to create "
                "them sharded on the devices, or materialise the model first (to_empty, then init_weights)."
            )
        if len(on_meta) != len(named):
            raise ValueError(f"Only some parameters are on the meta device (e.g. {on_meta[0]}): all or none may be.")
        from titanpod.parallel.xla_executor import create_params

        created = create_params({name: tuple(p.shape) for name, p in named}, initial_values, mesh, plan, axes)
        return [created[name] for name, _ in named]
    if plan is None:
        whole = replicated(mesh)
        return [jax.device_put(np.asarray(p.detach().cpu()), whole) for _, p in named]
    from titanpod.parallel.xla_executor import place_params as place_by_plan

    placed = place_by_plan(dict(named), plan, mesh, axes)
    return [placed[name] for name, _ in named]


def zeros(shape: tuple[int, ...] | torch.Size, sharding: Any) -> Any:
    """An fp32 jax array of zeros, made in place on the devices of ``sharding``."""
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda: jnp.zeros(tuple(shape), jnp.float32), out_shardings=sharding)()


def zero_adamw_state(params: Sequence[Any], mesh: Any, moment_shardings: Sequence[Any]) -> AdamWState:
    """AdamW's state for the jax arrays ``params``: step 0 replicated on ``mesh``, zero moments laid out as
    ``moment_shardings`` (the parameters' own, or those in host memory)."""
    return AdamWState(  # type: ignore[arg-type]  # jax arrays in the torch lanes' container
        step=zeros((), replicated(mesh)),
        exp_avg=[zeros(p.shape, s) for p, s in zip(params, moment_shardings, strict=True)],
        exp_avg_sq=[zeros(p.shape, s) for p, s in zip(params, moment_shardings, strict=True)],
    )


def zero_adamw_state_in_pieces(
    params: Sequence[Any], mesh: Any, rows: Sequence[Rows], host_shardings: Sequence[Any]
) -> AdamWState:
    """AdamW's state for the jax arrays ``params`` with the moments in host memory: step 0 replicated on ``mesh``,
    each parameter's zero moments as its pieces (``rows``), each piece laid out as its ``host_shardings`` entry."""
    entries = list(zip(params, rows, host_shardings, strict=True))
    return AdamWState(  # type: ignore[arg-type]  # jax arrays in the torch lanes' container
        step=zeros((), replicated(mesh)),
        exp_avg=[zero_pieces(p.shape, r, s) for p, r, s in entries],
        exp_avg_sq=[zero_pieces(p.shape, r, s) for p, r, s in entries],
    )


def load_state_tree(names: Sequence[str], own: Mapping[str, Any], tree: Mapping[str, Any]) -> tuple[list, AdamWState]:
    """The parameters and AdamW state of ``tree`` (jax or numpy arrays), each put on the sharding of its
    counterpart in ``own`` (the step's current tree); call inside the backend's runtime.

    Every entry of ``own`` must be in ``tree`` with the same shape and dtype (an "rng" entry, if any, is
    ignored); a missing, unexpected or mismatched entry raises ``ValueError`` naming it. The arrays
    returned are copies: ``tree`` stays valid after the step donates them.
    """
    import jax

    wanted = flatten_tree(own)
    given = flatten_tree({key: value for key, value in tree.items() if key != "rng"})
    check_tree_matches(wanted, given)
    placed = {path: jax.device_put(given[path], array.sharding, may_alias=False) for path, array in wanted.items()}
    params = [placed["model", name] for name in names]
    state = AdamWState(  # type: ignore[arg-type]  # jax arrays in the torch lanes' container
        step=placed["optim", "step"],
        exp_avg=[placed["optim", "exp_avg", name] for name in names],
        exp_avg_sq=[placed["optim", "exp_avg_sq", name] for name in names],
    )
    return params, state
