"""The xla step's parameters with the transformer blocks' stacked: one [L, ...] array per block parameter.

Legend: L transformer blocks.

With ``TrainConfig.scan_layers`` the step keeps ``layers.<i>.<rest>`` for every block i as one array
``layers.*.<rest>`` of shape [L, *shape], so its program can run the blocks as one ``lax.scan`` over
that leading axis without copying the parameters into a stack every step. The other parameters
(embeddings, final norm, head) stay as they are. ``LayerStack`` maps between the model's names
(what ``state_dict()`` and checkpoints use) and the step's entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STACKED = "layers.*."
"""The prefix of a stacked entry's name: ``layers.*.<rest>`` holds ``layers.<i>.<rest>`` for every block i."""


@dataclass(frozen=True)
class LayerStack:
    """The step's entries (stacked block parameters and the rest) and the model's parameters in each."""

    entries: tuple[str, ...]
    """The step's arrays, in order: a parameter's own name, or ``layers.*.<rest>`` for a stacked one."""
    members: tuple[tuple[str, ...], ...]
    """Per entry, the model's parameter names it holds: one name, or ``layers.0.<rest>`` .. ``layers.<L-1>.<rest>``."""
    layers: int
    """L: the blocks stacked."""

    @classmethod
    def flat(cls, names: Sequence[str]) -> LayerStack:
        """No stacking: every parameter its own entry (the step without ``scan_layers``)."""
        return cls(tuple(names), tuple((name,) for name in names), 0)

    @classmethod
    def of(cls, names: Sequence[str], shapes: Sequence[tuple[int, ...]], layers: int) -> LayerStack:
        """The stacking of parameters ``names`` (of ``shapes``) of a model with ``layers`` blocks in ``layers.<i>``.

        Every block must hold the same parameter names with the same shapes; otherwise ``ValueError`` names
        the first difference.
        """
        if layers < 1:
            raise ValueError("train.scan_layers needs a model with transformer blocks in model.layers; it has none.")
        shape_of = dict(zip(names, shapes, strict=True))
        per_block: list[dict[str, tuple[int, ...]]] = [{} for _ in range(layers)]
        for name in names:
            if name.startswith("layers."):
                index, _, rest = name.removeprefix("layers.").partition(".")
                per_block[int(index)][rest] = tuple(shape_of[name])
        first = per_block[0]
        for index, block in enumerate(per_block[1:], start=1):
            if block != first:
                odd = sorted(set(block.items()) ^ set(first.items()))
                raise ValueError(
                    f"train.scan_layers runs the transformer blocks as one loop over stacked parameters, so every "
                    f"block must hold the same parameters; layers.{index} differs from layers.0 in {odd[0][0]} "
                    f"(shape {odd[0][1]}). Set train.scan_layers=false for this model."
                )
        entries: list[str] = []
        members: list[tuple[str, ...]] = []
        for name in names:
            if not name.startswith("layers."):
                entries.append(name)
                members.append((name,))
            elif name.startswith("layers.0."):
                rest = name.removeprefix("layers.0.")
                entries.append(STACKED + rest)
                members.append(tuple(f"layers.{i}.{rest}" for i in range(layers)))
        return cls(tuple(entries), tuple(members), layers)

    def is_stacked(self, index: int) -> bool:
        """Whether entry ``index`` is a stack of the blocks' parameters."""
        return self.entries[index].startswith(STACKED)

    @property
    def stacks_any(self) -> bool:
        """Whether any entry is stacked (the step then scans over the blocks)."""
        return any(self.is_stacked(index) for index in range(len(self.entries)))

    def entry_sharding(self, index: int, member_sharding: Any) -> Any:
        """Entry ``index``'s ``NamedSharding`` from its members' (a stack is not split along the blocks)."""
        if not self.is_stacked(index):
            return member_sharding
        from jax.sharding import NamedSharding, PartitionSpec

        return NamedSharding(member_sharding.mesh, PartitionSpec(None, *member_sharding.spec))

    def entry_shape(self, index: int, member_shape: Sequence[int]) -> tuple[int, ...]:
        """Entry ``index``'s shape from its members': [L, *shape] for a stack."""
        return (self.layers, *member_shape) if self.is_stacked(index) else tuple(member_shape)

    def template_names(self) -> list[str]:
        """The names of block 0's parameters, in the order of the stacked entries (what the scan's body binds)."""
        return [members[0] for index, members in enumerate(self.members) if self.is_stacked(index)]

    def per_entry(self, per_name: Mapping[str, Any]) -> list[Any]:
        """A value for each entry from one for each parameter: block 0's value for a stacked entry
        (e.g. its weight decay or sharding, which every block shares)."""
        return [per_name[members[0]] for members in self.members]

    def stack(self, per_name: Mapping[str, Any]) -> list[Any]:
        """The entries' arrays from the parameters' (jax or numpy): stacked entries built by ``jnp.stack``."""
        import jax.numpy as jnp

        return [
            jnp.stack([per_name[name] for name in members]) if self.is_stacked(index) else per_name[members[0]]
            for index, members in enumerate(self.members)
        ]

    def unstack(self, arrays: Sequence[Any]) -> dict[str, Any]:
        """The parameters' arrays from the entries': block i of a stacked entry is its slice i (a copy)."""
        per_name: dict[str, Any] = {}
        for index, (members, array) in enumerate(zip(self.members, arrays, strict=True)):
            if self.is_stacked(index):
                per_name.update({name: array[i] for i, name in enumerate(members)})
            else:
                per_name[members[0]] = array
        return per_name
