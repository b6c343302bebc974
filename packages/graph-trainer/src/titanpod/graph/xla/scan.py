"""The transformer blocks as one ``jax.lax.scan`` over stacked parameters, while the xla step is traced.

Legend: L blocks.

A model runs each list of its blocks through its block runner slot (``ops.block_runner``,
``titanpod.models.common.block_runner``), handing it how one block is called, the tensors carried from block
to block and the inputs every block shares. For the trace, ``scanned_layers`` fills that slot with a
``ScanRunner``: a scan whose body is the model's own call on block 0, bound to block i's slice of the stacked
parameters (``titanpod.graph.xla.layer_stack``). Block 0's forward is whatever the step made of it
(``rematerialised_blocks``: ``jax.checkpoint`` with the memory policy, the FSDP gather inside), so each trip of
the loop gathers, computes and is recomputed as one unrolled block is. The program then holds one block's code
however deep the model is. What a block gives out besides its carry (an MoE block's router logits and dropped
count) comes out of the scan stacked [L, ...] and goes back to the model one entry a block.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from titanpod.graph.binding import parameters_bound
from titanpod.graph.xla.gradient_sums import summing_scan
from titanpod.models.common.block_runner import BlockCall, Carry, blocks_in_order

SLOT = "block_runner"
"""The field of a model's ops (``ModelOps``, ``FluxOps``) that runs its blocks: where the scan is installed."""


@contextlib.contextmanager
def scanned_layers(
    model: nn.Module, stacked: Mapping[str, Sequence[Any]], sums: Mapping[str, Sequence[Any]] | None = None
) -> Iterator[None]:
    """While tracing, run each of ``model``'s block lists as one ``lax.scan`` over ``stacked``: each list's path
    (``layers``, ``transformer.double_blocks`` ...) -> the JAX values of its blocks' parameters stacked [L, ...],
    in the order of block 0's ``named_parameters``. ``sums``: for each list, running sums of gradients shaped as
    its stacked arrays; its loop's backward then adds into them (``titanpod.graph.xla.gradient_sums``), and the
    gradient with respect to its stacked arrays is their sum plus the true gradient.

    The module holding each list must run it through its ops' block runner slot; a ``ScanRunner`` fills that
    slot until the context ends. ``ValueError`` when a list's owner has no such slot, or when the model ran
    a stacked list some other way (its blocks would not have seen their parameters)."""
    lists: dict[str, nn.ModuleList] = {}
    for path, arrays in stacked.items():
        blocks = model.get_submodule(path)
        if not isinstance(blocks, nn.ModuleList):
            raise ValueError(f"train.scan_layers: {path} is not a list of blocks (an nn.ModuleList).")
        _check_count(blocks[0], arrays)
        lists[path] = blocks
    runner = ScanRunner(
        {blocks: list(stacked[path]) for path, blocks in lists.items()},
        {blocks: list(sums[path]) for path, blocks in lists.items()} if sums is not None else None,
    )
    owners = {id(owner): owner for owner in (_owner(model, path) for path in lists)}
    originals = [(owner, owner.ops) for owner in owners.values()]
    try:
        for owner, ops in originals:
            owner.ops = dataclasses.replace(ops, **{SLOT: runner})
        yield
    finally:
        for owner, ops in originals:
            owner.ops = ops
    unscanned = [path for path, blocks in lists.items() if not runner.ran(blocks)]
    if unscanned:
        raise ValueError(
            f"train.scan_layers: the model ran {', '.join(unscanned)} without its block runner "
            f"(ops.{SLOT}), so the loop over stacked parameters never ran. Set train.scan_layers=false."
        )


class ScanRunner:
    """A block runner (``titanpod.models.common.block_runner.BlockRunner``) that runs each list it has stacked
    parameters for as one ``lax.scan`` of its first block, and any other list as the plain loop."""

    def __init__(
        self, stacked: Mapping[nn.Module, Sequence[Any]], sums: Mapping[nn.Module, Sequence[Any]] | None = None
    ) -> None:
        """``stacked``: each block list -> its blocks' parameters stacked [L, ...]; ``sums``: each list -> the
        running sums of their gradients its backward adds into (``titanpod.graph.xla.gradient_sums``)."""
        self._stacked = {id(blocks): list(arrays) for blocks, arrays in stacked.items()}
        self._sums = {id(blocks): list(arrays) for blocks, arrays in (sums or {}).items()}
        self._ran: set[int] = set()

    def ran(self, blocks: nn.Module) -> bool:
        """Whether ``blocks`` has been run as a scan."""
        return id(blocks) in self._ran

    def __call__(
        self, blocks: Sequence[nn.Module], call: BlockCall, carry: Carry, inputs: tuple[Any, ...]
    ) -> tuple[Carry, list[Any]]:
        """The last block's carry and each block's other output, as ``blocks_in_order`` gives them."""
        arrays = self._stacked.get(id(blocks))
        if arrays is None:
            return blocks_in_order(blocks, call, carry, inputs)
        import jax
        from torchax.interop import jax_view, torch_view

        template = blocks[0]
        sums = self._sums.get(id(blocks))
        leaves, tree = pytree.tree_flatten(inputs)
        is_tensor = [isinstance(leaf, torch.Tensor) for leaf in leaves]

        def body(carry_j: tuple[Any, ...], slices_j: list[Any], shared_j: list[Any]) -> tuple[tuple[Any, ...], Any]:
            given = iter(torch_view(shared_j))
            now = pytree.tree_unflatten(
                [next(given) if flag else leaf for leaf, flag in zip(leaves, is_tensor, strict=True)], tree
            )
            with parameters_bound(template, torch_view(slices_j)):
                next_carry, out = call(template, tuple(torch_view(carry_j)), now)
            return tuple(jax_view(tuple(next_carry))), jax_view(out)

        first = tuple(jax_view(tuple(carry)))
        shared = jax_view([leaf for leaf, flag in zip(leaves, is_tensor, strict=True) if flag])
        if sums is None:
            carry_j, out_L = jax.lax.scan(lambda inner, slices_j: body(inner, slices_j, shared), first, arrays)
        else:
            carry_j, out_L = summing_scan(body, first, arrays, sums, shared)
        self._ran.add(id(blocks))
        return tuple(torch_view(carry_j)), [torch_view(_block_slice(out_L, i)) for i in range(len(blocks))]


def _block_slice(tree: Any, index: int) -> Any:
    """Block ``index``'s entry of a scan's stacked outputs (``None`` stays ``None``)."""
    import jax

    return jax.tree.map(lambda stacked: stacked[index], tree)


def _owner(model: nn.Module, path: str) -> nn.Module:
    """The module holding the block list at ``path``; ``ValueError`` when it has no block runner slot."""
    owner = model.get_submodule(path.rpartition(".")[0])
    ops = getattr(owner, "ops", None)
    if not (dataclasses.is_dataclass(ops) and any(f.name == SLOT for f in dataclasses.fields(ops))):
        raise ValueError(
            f"train.scan_layers needs a model that runs its blocks through the block runner slot of its ops "
            f"(ops.{SLOT}: titanpod.models ModelOps, FluxOps); {type(owner).__name__}, which holds {path}, has "
            f"none. Set train.scan_layers=false."
        )
    return owner


def _check_count(template: nn.Module, stacked: Sequence[Any]) -> None:
    count = len(list(template.parameters()))
    if count != len(stacked):
        raise ValueError(f"Block 0 has {count} parameters but {len(stacked)} stacked arrays were given.")
