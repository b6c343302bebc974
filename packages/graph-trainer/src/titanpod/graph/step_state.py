"""A step's state as a tree keyed by parameter name: the torch steps' optimizer state out and in,
and the checks every step runs on a tree it is given to load.

A tree is nested dicts whose leaves are tensors or arrays (torch, jax or numpy); a path is the
tuple of keys that leads to a leaf. The optimizer state's tree is::

    {"step": 0-d, "exp_avg": {name: m}, "exp_avg_sq": {name: v}}

the ``"optim"`` part of the trainer-state layout (``titanpod.graph.optimizer.state_tree``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from titanpod.graph.optimizer import AdamWState, local_tensor, shard_like

Path = tuple[str, ...]
"""The keys that lead from a tree's root to one leaf."""


def flatten_tree(node: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Every leaf of the nested dicts ``node``, by its path."""
    if not isinstance(node, Mapping):
        return {prefix: node}
    return {path: leaf for key, child in node.items() for path, leaf in flatten_tree(child, (*prefix, key)).items()}


def _dtype_name(leaf: Any) -> str:
    """A leaf's dtype by the name torch, numpy and jax share (``float32``, ``bfloat16``)."""
    return str(leaf.dtype).removeprefix("torch.")


def _shown(paths: list[Path]) -> str:
    return ", ".join(" / ".join(path) for path in paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


def check_tree_matches(wanted: Mapping[Path, Any], given: Mapping[Path, Any]) -> None:
    """Raise ``ValueError`` naming what differs unless ``given`` has exactly the paths of ``wanted``,
    each leaf with the same (global) shape and dtype."""
    missing, unexpected = sorted(set(wanted) - set(given)), sorted(set(given) - set(wanted))
    if missing or unexpected:
        raise ValueError(
            f"The state tree does not match the step: missing [{_shown(missing)}], unexpected [{_shown(unexpected)}]."
        )
    for path, leaf in wanted.items():
        got = given[path]
        if tuple(got.shape) != tuple(leaf.shape) or _dtype_name(got) != _dtype_name(leaf):
            raise ValueError(
                f"{' / '.join(path)} is {_dtype_name(got)}{list(got.shape)} in the state tree; "
                f"the step holds {_dtype_name(leaf)}{list(leaf.shape)}."
            )


def optimizer_state_dict(names: Sequence[str], params: Sequence[torch.Tensor], state: AdamWState) -> dict[str, Any]:
    """``state`` keyed by parameter name, each moment laid out like its parameter (a DTensor over this
    rank's shard when the parameter is sharded), so torch.distributed.checkpoint reshards it.

    The tensors share storage with ``state``: writing into them (a checkpoint load) changes the state.
    """
    return {
        "step": state.step,
        "exp_avg": {name: shard_like(m, p) for name, m, p in zip(names, state.exp_avg, params, strict=True)},
        "exp_avg_sq": {name: shard_like(v, p) for name, v, p in zip(names, state.exp_avg_sq, params, strict=True)},
    }


def load_optimizer_state_(
    state: AdamWState, names: Sequence[str], params: Sequence[torch.Tensor], tree: Mapping[str, Any]
) -> None:
    """Copy ``tree`` (the layout of ``optimizer_state_dict``) into ``state``'s own tensors, in place.

    Every entry must be there with its parameter's shape and a moment of a sharded parameter must be
    a DTensor with that parameter's placements (as ``optimizer_state_dict`` gives it); anything else
    raises ``ValueError`` naming the entry.
    """
    own = optimizer_state_dict(names, params, state)
    wanted, given = flatten_tree(own), flatten_tree(tree)
    check_tree_matches(wanted, given)
    for path, target in wanted.items():
        _check_layout(path, target, given[path])
    with torch.no_grad():
        for path, target in wanted.items():
            local_tensor(target).copy_(local_tensor(given[path]))


def _layout(tensor: Any) -> str:
    return f"sharded as {tuple(tensor.placements)}" if isinstance(tensor, DTensor) else "whole"


def _check_layout(path: Path, target: Any, source: Any) -> None:
    """Raise ``ValueError`` unless ``source`` is laid out as ``target``: both whole, or DTensors placed alike."""
    same = (
        tuple(source.placements) == tuple(target.placements)
        if isinstance(target, DTensor) and isinstance(source, DTensor)
        else not isinstance(target, DTensor) and not isinstance(source, DTensor)
    )
    if not same:
        raise ValueError(
            f"{' / '.join(path)} is {_layout(source)} in the state tree; the step holds it {_layout(target)}. "
            "Load a tree laid out as the step's state_dict() gives it."
        )
