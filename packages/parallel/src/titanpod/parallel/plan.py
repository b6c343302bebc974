"""A sharding plan: for every parameter, which tensor dimension each mesh axis splits.

Written once per model family as data, applied by either executor (DTensor or XLA SPMD).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import torch

from titanpod.parallel.config import MESH_AXES
from titanpod.parallel.errors import PlanError


@dataclass(frozen=True)
class ParamRule:
    """The layout of the parameters whose names match ``pattern``."""

    pattern: str
    """Regular expression matched against the whole parameter name."""
    shard_dim: int
    """Tensor dimension split over the data-parallel shard axes (``fsdp``, and ``ep`` for non-experts)."""
    tp_dim: int | None = None
    """Tensor dimension split over ``tp``; ``None`` keeps the parameter whole on every tp rank."""
    ep_dim: int | None = None
    """Tensor dimension split over ``ep`` (experts); such a parameter is an expert parameter."""
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

    def check(self, named_params: dict[str, torch.Tensor], axes: dict[str, int]) -> None:
        """Check every parameter's split dimensions divide by their axis sizes; ``PlanError`` lists all that do not."""
        unknown = sorted(set(axes) - set(MESH_AXES))
        if unknown:
            raise PlanError(
                f"Mesh axes {', '.join(unknown)} are not ones a plan can use; the axes are {', '.join(MESH_AXES)}."
            )
        shard_ways = {"expert": axes.get("fsdp", 1), "other": axes.get("fsdp", 1) * axes.get("ep", 1)}
        problems = []
        for name, param in named_params.items():
            rule = self.rule_for(name)
            splits = {rule.shard_dim: shard_ways["expert" if rule.ep_dim is not None else "other"]}
            if rule.tp_dim is not None:
                splits[rule.tp_dim] = splits.get(rule.tp_dim, 1) * axes.get("tp", 1)
            if rule.ep_dim is not None:
                splits[rule.ep_dim] = splits.get(rule.ep_dim, 1) * axes.get("ep", 1)
            for dim, ways in splits.items():
                if dim >= param.ndim or param.shape[dim] % ways:
                    size = param.shape[dim] if dim < param.ndim else "absent"
                    problems.append(f"{name} {tuple(param.shape)}: dimension {dim} ({size}) cannot split {ways} ways")
        if problems:
            raise PlanError(
                "The sharding plan does not fit this model on this mesh:\n  " + "\n  ".join(problems)
                + "\nChoose parallel degrees that divide these dimensions."
            )  # fmt: skip
