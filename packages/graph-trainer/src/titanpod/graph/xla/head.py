"""The output head on the xla lane: gathered where the loss uses it, and gathered again for its backward.

A model's head + loss slot (``model.ops.head_loss``) is called with the head weight, [V, M]: at a large
vocabulary the largest parameter a chip gathers (1 GiB in bf16 at 128K x 4,096). Gathered once for the
forward and kept for the backward, it stays live from the loss to the end of the step. Here the slot runs
under ``jax.checkpoint`` with the gather inside, as a transformer block does (``titanpod.graph.xla.remat``):
the backward gathers the head again. Only what the loss kernels return (per-row columns such as the
logsumexp, and the [N, V] logits when the Pallas loss keeps them, ``PallasLossConfig.keep_logits``) is kept,
so the loss's forward kernels are not run twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from titanpod.graph.xla.remat import BlockGather


def head_parameter(model: nn.Module) -> str | None:
    """The name of the parameter ``model`` passes to its head + loss slot (``model.head_weight``), or ``None``
    for a model without that slot."""
    ops = getattr(model, "ops", None)
    if ops is None or not hasattr(ops, "head_loss") or not hasattr(model, "head_weight"):
        return None
    by_id = {id(param): name for name, param in model.named_parameters()}
    return by_id.get(id(model.head_weight))


def kernel_outputs_saveable(prim: Any, *_: Any, **__: Any) -> bool:
    """A ``jax.checkpoint`` policy: keep what a Pallas kernel returns, recompute everything else."""
    return prim.name == "pallas_call"


@contextlib.contextmanager
def regathered_head(
    model: nn.Module, name: str, bound: Callable[[], Any], stored: Any, gather: BlockGather
) -> Iterator[None]:
    """While tracing, run ``model``'s head + loss slot with head ``name`` gathered inside ``jax.checkpoint``.

    ``bound()`` is the tensor ``functional_call`` binds to the head (what the model passes the slot);
    ``stored`` is the head's JAX value as stored (sharded), which ``gather(name, stored)`` lays out whole.
    A call with any other weight runs the slot unchanged.
    """
    import jax
    from torchax.interop import jax_view, torch_view

    ops = model.ops  # type: ignore[attr-defined]
    original = ops.head_loss

    def head_loss(h_BSM: Any, weight_VM: Any, labels_BS: Any) -> Any:
        if weight_VM is not bound():
            return original(h_BSM, weight_VM, labels_BS)

        def region(h: Any, head: Any, labels: Any) -> Any:
            return jax_view(original(torch_view(h), torch_view(gather(name, head)), torch_view(labels)))

        run = jax.checkpoint(region, policy=kernel_outputs_saveable)
        return torch_view(run(jax_view(h_BSM), stored, jax_view(labels_BS)))

    model.ops = dataclasses.replace(ops, head_loss=head_loss)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        model.ops = ops  # type: ignore[attr-defined]
