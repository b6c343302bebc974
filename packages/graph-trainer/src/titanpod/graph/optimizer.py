"""Functional AdamW: the update as plain tensor ops, so every step mode runs the same arithmetic.

The eager loop calls it on live tensors; the whole-step capture traces it into the step's
graph; the xla lane runs it inside ``jax.jit``. It works on local tensors (a sharded
parameter's own shard), so it needs no collectives: only the gradient norm does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from titanpod.graph.config import TrainConfig


@dataclass
class AdamWState:
    """AdamW's state for a list of parameters, in the parameters' order and layout."""

    step: torch.Tensor
    """Updates applied so far (a 0-d float tensor; skipped steps do not count)."""
    exp_avg: list[torch.Tensor]
    """First-moment estimates, one per parameter."""
    exp_avg_sq: list[torch.Tensor]
    """Second-moment estimates, one per parameter."""


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: the shard of a DTensor, else the tensor itself (sharing storage)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def shard_like(local: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``local`` as ``param`` is laid out: a DTensor over it with the parameter's mesh, placements,
    shape and stride when ``param`` is sharded, else ``local`` itself (the inverse of ``local_tensor``)."""
    if not isinstance(param, DTensor):
        return local
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )


def state_tree(names: Sequence[str], params: Sequence[Any], state: AdamWState) -> dict[str, Any]:
    """Parameters and AdamW state in the nested layout trainer checkpoints use (torch tensors or jax arrays):
    ``{"model": {name: param}, "optim": {"step": step, "exp_avg": {name: m}, "exp_avg_sq": {name: v}}}``."""
    return {
        "model": dict(zip(names, params, strict=True)),
        "optim": {
            "step": state.step,
            "exp_avg": dict(zip(names, state.exp_avg, strict=True)),
            "exp_avg_sq": dict(zip(names, state.exp_avg_sq, strict=True)),
        },
    }


def init_adamw_state(params: Sequence[torch.Tensor]) -> AdamWState:
    """Zero moments shaped like each parameter's local part, and step 0."""
    locals_ = [local_tensor(p.detach()) for p in params]
    return AdamWState(
        step=torch.zeros((), dtype=torch.float32, device=locals_[0].device),
        exp_avg=[torch.zeros_like(p, dtype=torch.float32) for p in locals_],
        exp_avg_sq=[torch.zeros_like(p, dtype=torch.float32) for p in locals_],
    )


def weight_decays(params: Sequence[torch.Tensor], config: TrainConfig) -> list[float]:
    """The decay of each parameter: ``config.weight_decay`` for matrices, none for vectors (norms)."""
    return [config.weight_decay if p.ndim >= 2 else 0.0 for p in params]


WITHOUT_FOREACH = frozenset({"xla"})
"""Device types whose tensors torch's ``get_total_norm`` refuses to take through foreach kernels."""


def total_grad_norm(grads: Sequence[torch.Tensor], foreach: bool = True) -> torch.Tensor:
    """The global L2 norm of ``grads``, whole even when the gradients are sharded DTensors.

    ``foreach=False`` computes the same norm tensor by tensor, for tensor types without
    foreach kernels (torchax's); torch_xla's lazy ``xla`` tensors always take that path.
    """
    foreach = foreach and all(g.device.type not in WITHOUT_FOREACH for g in grads)
    norm = torch.nn.utils.get_total_norm(list(grads), foreach=foreach)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def adamw_update_(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: AdamWState,
    lr: torch.Tensor,
    grad_norm: torch.Tensor,
    decays: Sequence[float],
    config: TrainConfig,
) -> torch.Tensor:
    """Clip, check and apply one AdamW update in place; returns whether it was applied (0-d bool).

    ``params``, ``grads`` and the state are local tensors; ``lr`` and ``grad_norm`` are 0-d
    tensors, so a captured step never recompiles for a new learning rate. The gradients are
    scaled by ``min(1, grad_clip / (grad_norm + 1e-6))`` when clipping is on. When
    ``grad_norm`` is not finite nothing changes (parameters, moments and step stay as they
    were), decided on the device without a host sync; the caller reads the flag later.
    """
    finite = torch.isfinite(grad_norm)
    keep = finite.to(torch.float32)
    scale = keep
    if config.grad_clip > 0:  # a NaN norm must not leak through the factor: 0 x NaN is NaN
        scale = torch.where(finite, torch.clamp(config.grad_clip / (grad_norm + 1e-6), max=1.0), 0.0)
    step = state.step.add_(keep)
    step_for_bias = torch.clamp(step, min=1.0)  # a skipped first step must not divide by zero
    bias1 = 1.0 - torch.pow(config.beta1, step_for_bias)
    bias2_sqrt = torch.sqrt(1.0 - torch.pow(config.beta2, step_for_bias))
    step_size = lr * keep / bias1
    for param, grad, exp_avg, exp_avg_sq, decay in zip(
        params, grads, state.exp_avg, state.exp_avg_sq, decays, strict=True
    ):
        grad = torch.where(finite, grad.float(), 0.0) * scale
        exp_avg.lerp_(grad, (1.0 - config.beta1) * keep)
        exp_avg_sq.mul_(1.0 - (1.0 - config.beta2) * keep).add_(grad * grad * (1.0 - config.beta2))
        denom = exp_avg_sq.sqrt() / bias2_sqrt + config.eps
        if decay:
            param.mul_(1.0 - lr * keep * decay)
        param.sub_((step_size * exp_avg / denom).to(param.dtype))
    return finite
