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


@contextlib.contextmanager
def rematerialised_blocks(model: nn.Module, whole: nn.Module, policy: Any) -> Iterator[None]:
    """While tracing, run each transformer block of ``model`` (``layers.<i>``) under ``jax.checkpoint(policy)``.

    A block's inputs are what the backward keeps of it (plus what ``policy`` saves); its
    other activations are recomputed in the backward, one block at a time, as the torch
    lanes' policies do. A model without ``layers`` is rematerialised as a whole: ``whole``,
    the module whose forward runs its loss.
    """
    blocks = getattr(model, "layers", None)
    targets: list[nn.Module] = list(blocks) if isinstance(blocks, nn.ModuleList) else [whole]
    originals = {id(block): block.__dict__.get("forward") for block in targets}
    try:
        for block in targets:
            block.forward = checkpointed_forward(block, block.forward, policy)  # type: ignore[method-assign]
        yield
    finally:
        for block in targets:
            original = originals[id(block)]
            if original is None:
                del block.forward
            else:
                block.forward = original  # type: ignore[method-assign]


def checkpointed_forward(block: nn.Module, forward: Callable[..., Any], policy: Any) -> Callable[..., Any]:
    """``forward`` of ``block`` as a torch callable that runs under ``jax.checkpoint``: the block's
    parameters and tensor arguments go in as JAX values, other arguments are closed over."""
    import jax
    from torch.utils import _pytree as pytree
    from torchax.interop import jax_view, torch_view

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        params = [p for _, p in block.named_parameters()]  # the tensors functional_call bound
        leaves, tree = pytree.tree_flatten((args, kwargs))
        is_tensor = [isinstance(leaf, torch.Tensor) for leaf in leaves]

        def body(params_j: list[Any], tensors_j: list[Any]) -> Any:
            tensors = iter(torch_view(tensors_j))
            full = [next(tensors) if flag else leaf for leaf, flag in zip(leaves, is_tensor, strict=True)]
            call_args, call_kwargs = pytree.tree_unflatten(full, tree)
            with parameters_bound(block, torch_view(params_j)):
                return jax_view(forward(*call_args, **call_kwargs))

        tensors = [leaf for leaf, flag in zip(leaves, is_tensor, strict=True) if flag]
        return torch_view(jax.checkpoint(body, policy=policy)(jax_view(params), jax_view(tensors)))

    return checkpointed
