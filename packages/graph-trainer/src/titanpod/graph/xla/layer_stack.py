"""The xla step's parameters with the transformer blocks' stacked: one [L, ...] array per block parameter.

Legend: L transformer blocks.

With ``TrainConfig.scan_layers`` the step keeps ``layers.<i>.<rest>`` for every block i as one array
``layers.*.<rest>`` of shape [L, *shape], so its program can run the blocks as one ``lax.scan`` over
that leading axis without copying the parameters into a stack every step. A model with several block
lists (FLUX's double- and single-stream blocks) has one such stack per list. The other parameters
(embeddings, final norm, head) stay as they are. ``LayerStack`` maps between the model's names
(what ``state_dict()`` and checkpoints use) and the step's entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STACKED = "layers.*."
"""The prefix of a decoder's stacked entry's name: ``layers.*.<rest>`` holds ``layers.<i>.<rest>`` for every block
i. A model with other block lists (``titanpod.graph.blocks``: FLUX's ``transformer.double_blocks``) has
``<list>.*.<rest>`` entries alike, one set a list."""

MARK = ".*."
"""What a stacked entry's name holds between its block list's path and the parameter's path in a block."""


@dataclass(frozen=True)
class LayerStack:
    """The step's entries (stacked block parameters and the rest) and the model's parameters in each."""

    entries: tuple[str, ...]
    """The step's arrays, in order: a parameter's own name, or ``<list>.*.<rest>`` for a stacked one."""
    members: tuple[tuple[str, ...], ...]
    """Per entry, the model's parameter names it holds: one name, or ``<list>.0.<rest>`` .. ``<list>.<L-1>.<rest>``."""
    lists: tuple[tuple[str, int], ...] = ()
    """Each stacked block list's path and its blocks, in the model's order (empty: nothing stacked)."""

    @property
    def layers(self) -> int:
        """L: the blocks stacked, over every list."""
        return sum(count for _, count in self.lists)

    @classmethod
    def flat(cls, names: Sequence[str]) -> LayerStack:
        """No stacking: every parameter its own entry (the step without ``scan_layers``)."""
        return cls(tuple(names), tuple((name,) for name in names))

    @classmethod
    def of(cls, names: Sequence[str], shapes: Sequence[tuple[int, ...]], layers: int | Mapping[str, int]) -> LayerStack:
        """The stacking of parameters ``names`` (of ``shapes``): ``layers`` is a decoder's block count (its blocks
        in ``layers.<i>``), or each block list's path -> its block count (e.g. FLUX's two lists).

        Every block of a list must hold the same parameter names with the same shapes; otherwise ``ValueError``
        names the first difference.
        """
        lists = {"layers": layers} if isinstance(layers, int) else dict(layers)
        if not lists or min(lists.values()) < 1:
            raise ValueError("train.scan_layers needs a model with transformer blocks in model.layers; it has none.")
        shape_of = dict(zip(names, shapes, strict=True))
        Block = dict[str, tuple[int, ...]]  # path in the block -> shape
        blocks: dict[str, list[Block]] = {path: [{} for _ in range(count)] for path, count in lists.items()}
        for name in names:
            found = _in_list(name, lists)
            if found is not None:
                path, index, rest = found
                blocks[path][index][rest] = tuple(shape_of[name])
        for path, per_block in blocks.items():
            first = per_block[0]
            for index, block in enumerate(per_block[1:], start=1):
                if block != first:
                    odd = sorted(set(block.items()) ^ set(first.items()))
                    raise ValueError(
                        f"train.scan_layers runs the transformer blocks as one loop over stacked parameters, so every "
                        f"block must hold the same parameters; {path}.{index} differs from {path}.0 in {odd[0][0]} "
                        f"(shape {odd[0][1]}). Set train.scan_layers=false for this model."
                    )
        entries: list[str] = []
        members: list[tuple[str, ...]] = []
        for name in names:
            found = _in_list(name, lists)
            if found is None:
                entries.append(name)
                members.append((name,))
            elif found[1] == 0:
                path, _, rest = found
                entries.append(f"{path}{MARK}{rest}")
                members.append(tuple(f"{path}.{i}.{rest}" for i in range(lists[path])))
        return cls(tuple(entries), tuple(members), tuple(lists.items()))

    def list_of(self, index: int) -> str | None:
        """The block list entry ``index`` stacks (``None`` for an entry of its own)."""
        path, mark, _ = self.entries[index].partition(MARK)
        return path if mark and path in dict(self.lists) else None

    def is_stacked(self, index: int) -> bool:
        """Whether entry ``index`` is a stack of the blocks' parameters."""
        return self.list_of(index) is not None

    @property
    def stacks_any(self) -> bool:
        """Whether any entry is stacked (the step then scans over the blocks)."""
        return bool(self.lists)

    def entry_sharding(self, index: int, member_sharding: Any) -> Any:
        """Entry ``index``'s ``NamedSharding`` from its members' (a stack is not split along the blocks)."""
        if not self.is_stacked(index):
            return member_sharding
        from jax.sharding import NamedSharding, PartitionSpec

        return NamedSharding(member_sharding.mesh, PartitionSpec(None, *member_sharding.spec))

    def entry_shape(self, index: int, member_shape: Sequence[int]) -> tuple[int, ...]:
        """Entry ``index``'s shape from its members': [L, *shape] for a stack of L blocks."""
        path = self.list_of(index)
        return tuple(member_shape) if path is None else (dict(self.lists)[path], *member_shape)

    def template_names(self) -> list[str]:
        """The names of block 0's parameters, in the order of the stacked entries (what the scan's body binds)."""
        return [members[0] for index, members in enumerate(self.members) if self.is_stacked(index)]

    def by_list(self, entries: Sequence[Any]) -> dict[str, list[Any]]:
        """Each block list's path -> its stacked entries among ``entries`` (one value per entry), in order: the
        stacked arrays a scan over that list's blocks takes, in the order of block 0's parameters."""
        grouped: dict[str, list[Any]] = {path: [] for path, _ in self.lists}
        for index, value in enumerate(entries):
            path = self.list_of(index)
            if path is not None:
                grouped[path].append(value)
        return grouped

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


def _in_list(name: str, lists: Mapping[str, int]) -> tuple[str, int, str] | None:
    """(list path, block index, path in the block) of a parameter of a block in one of ``lists``; else ``None``."""
    for path in lists:
        if name.startswith(path + "."):
            index, _, rest = name.removeprefix(path + ".").partition(".")
            if index.isdigit():
                return path, int(index), rest
    return None
