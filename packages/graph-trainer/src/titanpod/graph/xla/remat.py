"""Activation memory on the xla lane: each transformer block rematerialised under ``jax.checkpoint``.

The torch lanes rewrite the captured graph (``titanpod.graph.memory_policy``); here the same
policies become ``jax.checkpoint_policies``, applied around each block while the step is traced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from titanpod.graph.binding import parameters_bound
from titanpod.graph.blocks import transformer_blocks

REMAT_POLICIES = {
    "save": None,
    "recompute": "nothing_saveable",
    "selective": "dots_with_no_batch_dims_saveable",
    "offload": "offload_dot_with_no_batch_dims",
}
"""``TrainConfig.memory_policy`` -> the ``jax.checkpoint_policies`` entry each transformer block is
rematerialised with (None: no rematerialisation). ``selective`` keeps the projections' matmul
outputs (dots without batch dimensions) and recomputes the rest, attention scores included:
those are [B, H, S, S], the largest activation, which is why ``dots_saveable`` is not used.
``offload`` moves those same matmul outputs to pinned host memory instead of keeping them."""


def remat_policy(memory_policy: str) -> Any:
    """The ``jax.checkpoint`` policy for ``memory_policy`` (None for ``save``)."""
    name = REMAT_POLICIES[memory_policy]
    if name is None:
        return None
    import jax

    policies = jax.checkpoint_policies
    if memory_policy == "offload":
        if not _has_pinned_host():
            raise ValueError(
                "memory_policy='offload' on the xla lane offloads to pinned host memory, which this JAX backend "
                f"({jax.default_backend()}) does not have; run it on TPU or GPU, or use memory_policy='recompute' "
                "(or 'selective') here."
            )
        return policies.offload_dot_with_no_batch_dims("device", "pinned_host")
    return getattr(policies, name)


def _has_pinned_host() -> bool:
    import jax

    device = jax.devices()[0]
    try:
        kinds = {memory.kind for memory in device.addressable_memories()}
    except Exception:
        return False
    return "pinned_host" in kinds


BlockGather = Callable[[str, Any], Any]
"""``gather(name, array)``: parameter ``name`` (as the model names it) as a block uses it, e.g. its FSDP
shards gathered by a sharding constraint; ``array`` is the JAX value of the stored parameter."""


@contextlib.contextmanager
def rematerialised_blocks(
    model: nn.Module,
    whole: nn.Module,
    policy: Any,
    gather: BlockGather | None = None,
    layout_input: Callable[[Any], Any] | None = None,
) -> Iterator[None]:
    """While tracing, run each transformer block of ``model`` (``titanpod.graph.blocks.transformer_blocks``: a
    decoder's ``layers.<i>``, FLUX's double- and single-stream blocks) under ``jax.checkpoint(policy)``.

    A block's inputs are what the backward keeps of it (plus what ``policy`` saves); its
    other activations are recomputed in the backward, one block at a time, as the torch
    lanes' policies do. A model without blocks is rematerialised as a whole: ``whole``,
    the module whose forward runs its loss. ``policy`` ``None`` wraps the blocks without
    rematerialising them (for ``gather``).

    ``gather`` maps each of a block's parameters to what the block computes with, inside the
    block (so a recomputed block gathers again, as FSDP does, and nothing gathered is kept);
    ``layout_input`` lays out a block's first tensor argument (the hidden states).
    """
    targets: list[tuple[nn.Module, list[str]]]
    blocks = transformer_blocks(model)
    if blocks:
        targets = [(block, [f"{path}.{name}" for name, _ in block.named_parameters()]) for path, block in blocks]
    else:
        targets = [(whole, [name for name, _ in model.named_parameters()])]
    originals = {id(block): block.__dict__.get("forward") for block, _ in targets}
    try:
        for block, names in targets:
            block.forward = checkpointed_forward(  # type: ignore[method-assign]
                block, block.forward, policy, names, gather, layout_input
            )
        yield
    finally:
        for block, _ in targets:
            original = originals[id(block)]
            if original is None:
                del block.forward
            else:
                block.forward = original  # type: ignore[method-assign]


def checkpointed_forward(
    block: nn.Module,
    forward: Callable[..., Any],
    policy: Any,
    names: list[str] | None = None,
    gather: BlockGather | None = None,
    layout_input: Callable[[Any], Any] | None = None,
) -> Callable[..., Any]:
    """``forward`` of ``block`` as a torch callable that runs under ``jax.checkpoint`` (plainly, with ``policy``
    ``None``): the block's parameters and tensor arguments go in as JAX values, other arguments are closed
    over. ``gather`` (given the parameters' ``names`` in the model) and ``layout_input``: see
    ``rematerialised_blocks``."""
    import jax
    from torch.utils import _pytree as pytree
    from torchax.interop import jax_view, torch_view

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        params = [p for _, p in block.named_parameters()]  # the tensors functional_call bound
        leaves, tree = pytree.tree_flatten((args, kwargs))
        is_tensor = [isinstance(leaf, torch.Tensor) for leaf in leaves]

        def body(params_j: list[Any], tensors_j: list[Any]) -> Any:
            if gather is not None and names is not None:
                params_j = [gather(name, p) for name, p in zip(names, params_j, strict=True)]
            if layout_input is not None and tensors_j:
                tensors_j = [layout_input(tensors_j[0]), *tensors_j[1:]]
            tensors = iter(torch_view(tensors_j))
            full = [next(tensors) if flag else leaf for leaf, flag in zip(leaves, is_tensor, strict=True)]
            call_args, call_kwargs = pytree.tree_unflatten(full, tree)
            with parameters_bound(block, torch_view(params_j)):
                return jax_view(forward(*call_args, **call_kwargs))

        tensors = [leaf for leaf, flag in zip(leaves, is_tensor, strict=True) if flag]
        run = body if policy is None else jax.checkpoint(body, policy=policy)
        return torch_view(run(jax_view(params), jax_view(tensors)))

    return checkpointed
