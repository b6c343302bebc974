"""A sharding plan: for every parameter, which tensor dimension each mesh axis splits.

Written once per model family as data, applied by either executor (DTensor or XLA SPMD).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from titanpod.parallel.config import MESH_AXES, PARAM_SHARD_AXES
from titanpod.parallel.errors import PlanError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ParamRule:
    """The layout of the parameters whose names match ``pattern``."""

    pattern: str
    """Regular expression matched against the whole parameter name."""
    shard_dim: int | None
    """Tensor dimension split over the data-parallel shard axes (``fsdp``, and ``ep`` for non-experts);
    ``None`` keeps the parameter whole on every data rank (for tensors too small to split, such as
    per-head norms, whose few elements would not divide over a large mesh)."""
    tp_dim: int | None = None
    """Tensor dimension split over ``tp``; ``None`` keeps the parameter whole on every tp rank."""
    ep_dim: int | None = None
    """Tensor dimension split over ``ep`` (experts); such a parameter is an expert parameter."""
    tp_blocks: int = 1
    """The tp dimension is this many equal blocks laid end to end (a fused projection: FLUX's single-stream
    ``linear1`` rows are q, k, v and the MLP input), and tp splits each block: a rank computes with its share
    of every block, in block order, so each part keeps whole heads and matching hidden units. Stored split
    over tp as any tp dimension (one region a rank, as checkpoints read it); the torch executor gathers it
    whole over tp where it is used and sums its gradient back, the traffic FSDP has for it."""
    tp_grad: Literal["replicate", "sum", "sum_if_sequence_parallel"] = "replicate"
    """For a tp-whole parameter whose tp ranks see different activations, ``sum`` adds up their
    partial gradients: per-head norms inside a region always, norms between regions
    (``sum_if_sequence_parallel``) when the sequence is split over tp."""


@dataclass(frozen=True)
class ShardingPlan:
    """Parameter rules (first match wins) and the modules that run tensor-parallel."""

    params: tuple[ParamRule, ...]
    """One rule per kind of parameter."""
    tp_regions: tuple[str, ...] = ()
    """Patterns of modules whose input is the same on every tp rank and whose output is a
    partial sum over tp (attention, dense feed-forward): entered and left with a collective."""
    tp_enters: tuple[str, ...] = ()
    """Patterns of modules whose first input is the same on every tp rank and whose outputs stay split over
    tp (column-parallel projections, where the region's exit is another module): entered with a collective."""
    tp_leaves: tuple[str, ...] = ()
    """Patterns of row-parallel ``nn.Linear`` modules ending a region opened by ``tp_enters``: their product is
    summed over tp, then their bias (whole on every tp rank) added once."""
    sequence_starts: tuple[str, ...] = ()
    """With sequence parallelism: modules whose whole output each tp rank cuts to its sequence chunk."""
    sequence_ends: tuple[str, ...] = ()
    """With sequence parallelism: modules whose chunked output is gathered whole for the head and loss."""

    def rule_for(self, name: str) -> ParamRule:
        """The rule of parameter ``name``; ``PlanError`` if no rule matches."""
        for rule in self.params:
            if re.fullmatch(rule.pattern, name):
                return rule
        raise PlanError(f"No rule of the sharding plan matches parameter {name!r}; add one to the family's plan.")

    def splits(self, name: str, axes: Mapping[str, int]) -> dict[int, int]:
        """Tensor dimension -> how many ways the mesh ``axes`` split it, for parameter ``name``.

        The shard dimension splits over ``fsdp`` and ``cp`` (and ``ep`` for non-experts), the tp dimension
        over ``tp``, an expert dimension over ``ep``; an axis of size 1 splits nothing. A fused tp dimension
        (``ParamRule.tp_blocks``) counts its blocks too, each of which tp splits.
        """
        rule = self.rule_for(name)
        expert = rule.ep_dim is not None
        shard_ways = math.prod(axes.get(axis, 1) for axis in PARAM_SHARD_AXES) * (1 if expert else axes.get("ep", 1))
        splits = {} if rule.shard_dim is None else {rule.shard_dim: shard_ways}
        if rule.tp_dim is not None:
            tp = axes.get("tp", 1)
            splits[rule.tp_dim] = splits.get(rule.tp_dim, 1) * tp * (rule.tp_blocks if tp > 1 else 1)
        if rule.ep_dim is not None:
            splits[rule.ep_dim] = splits.get(rule.ep_dim, 1) * axes.get("ep", 1)
        return splits

    def local_numel(self, name: str, shape: tuple[int, ...], axes: Mapping[str, int]) -> int:
        """Elements of parameter ``name`` (of full ``shape``) that one rank holds on mesh ``axes``.

        An uneven split is rounded up, as padded shards are.
        """
        local = list(shape)
        rule = self.rule_for(name)
        blocks = rule.tp_blocks if axes.get("tp", 1) > 1 else 1
        for dim, ways in self.splits(name, axes).items():
            ways = ways // blocks if dim == rule.tp_dim else ways  # a rank holds a share of every block
            if dim < len(local):
                local[dim] = -(-local[dim] // ways)
        return math.prod(local)

    def check(self, named_params: dict[str, torch.Tensor], axes: Mapping[str, int]) -> None:
        """Check every parameter's split dimensions divide by their axis sizes; ``PlanError`` lists all that do not."""
        unknown = sorted(set(axes) - set(MESH_AXES))
        if unknown:
            raise PlanError(
                f"Mesh axes {', '.join(unknown)} are not ones a plan can use; the axes are {', '.join(MESH_AXES)}."
            )
        problems: dict[str, None] = {}  # ordered and deduplicated: every layer repeats the same problem
        for name, param in named_params.items():
            for dim, ways in self.splits(name, axes).items():
                if dim >= param.ndim or param.shape[dim] % ways:
                    size = param.shape[dim] if dim < param.ndim else "absent"
                    where = re.sub(r"^layers\.\d+\.", "layers.*.", name)
                    problems[f"{where} {tuple(param.shape)}: dimension {dim} ({size}) cannot split {ways} ways"] = None
        if problems:
            raise PlanError(
                "The sharding plan does not fit this model on this mesh:\n  " + "\n  ".join(problems)
                + "\nChoose parallel degrees that divide these dimensions."
            )  # fmt: skip
