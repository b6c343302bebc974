"""The block runner slot: how a model runs a list of its transformer blocks, one after another.

A model hands its runner the blocks, how one block is called (``BlockCall``), the tensors carried from
block to block (the hidden states) and the inputs every block shares (rotary tables, conditioning). The
reference, ``blocks_in_order``, is the plain loop; another layer may install a runner that computes the
same thing another way (e.g. the xla step's one loop over the blocks' stacked parameters), knowing
nothing of a block's signature: the call says it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

Carry = tuple[torch.Tensor, ...]
"""The tensors one block hands the next (a decoder's hidden states; FLUX's image and text streams)."""


class BlockCall(Protocol):
    """One block's step: the next carry, and what the block gives out besides it (``None``, or tensors)."""

    def __call__(self, block: nn.Module, carry: Carry, inputs: tuple[Any, ...]) -> tuple[Carry, Any]:
        """Run ``block`` on ``carry`` and the shared ``inputs``: (its carry for the next block, its other output)."""
        ...


class BlockRunner(Protocol):
    """Runs ``blocks`` in order, each through ``call``, the carry threaded from one to the next."""

    def __call__(
        self, blocks: Sequence[nn.Module], call: BlockCall, carry: Carry, inputs: tuple[Any, ...]
    ) -> tuple[Carry, list[Any]]:
        """The last block's carry, and each block's other output (one entry a block, in order)."""
        ...


def blocks_in_order(
    blocks: Sequence[nn.Module], call: BlockCall, carry: Carry, inputs: tuple[Any, ...]
) -> tuple[Carry, list[Any]]:
    """Reference block runner: a Python loop over ``blocks``."""
    emitted: list[Any] = []
    for block in blocks:
        carry, out = call(block, carry, inputs)
        emitted.append(out)
    return carry, emitted


def carry_in_carry_out(block: nn.Module, carry: Carry, inputs: tuple[Any, ...]) -> tuple[Carry, None]:
    """The ``BlockCall`` of a block called as ``block(*carry, *inputs)`` that returns its next carry (one tensor,
    or a tuple of them) and nothing else."""
    out = block(*carry, *inputs)
    return (out if isinstance(out, tuple) else (out,)), None
