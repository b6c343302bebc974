"""Functional AdamW: one update rule for every step mode, as one fused kernel or as plain tensor ops.

The eager loop calls it on live tensors; the whole-step capture traces it into the step's
graph; the xla lane runs it inside ``jax.jit``. It works on local tensors (a sharded
parameter's own shard), so it needs no collectives: only the gradient norm does.

Where the tensors allow it (fp32 tensors of a device torch has a fused AdamW kernel for:
cpu, cuda) the update is ``torch._fused_adamw_`` (as the custom op of ``titanpod.graph.fused_adamw``,
so a compiled step keeps it): one kernel per weight-decay group that reads each parameter,
gradient and moment once, with the clipping factor as its gradient scale and the NaN/Inf
guard as its ``found_inf``. Elsewhere (torchax's and torch_xla's tensors,
bf16 parameters) the same rule runs tensor by tensor as plain ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.distributed.tensor import DTensor

from titanpod.graph.config import TrainConfig
from titanpod.graph.fused_adamw import fused_adamw_op


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


FUSED_DEVICES = frozenset({"cpu", "cuda"})
"""Device types torch has a fused AdamW kernel (``torch._fused_adamw_``) for."""

Implementation = Literal["auto", "fused", "per_tensor"]
"""How ``adamw_update_`` runs: ``fused`` (one kernel per weight-decay group), ``per_tensor`` (plain
ops, parameter by parameter) or ``auto`` (fused wherever ``can_fuse`` allows it)."""


def can_fuse(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``torch._fused_adamw_`` takes these tensors: plain fp32 tensors (not DTensors, not another
    library's tensor type) on a device in ``FUSED_DEVICES``."""
    return all(
        isinstance(t, torch.Tensor)
        and not isinstance(t, DTensor)
        and t.dtype == torch.float32
        and t.device.type in FUSED_DEVICES
        for t in tensors
    )


def _updated_in_place(params: Sequence[torch.Tensor], state: AdamWState) -> bool:
    """Whether the tensors the fused kernel writes are contiguous: it reads and writes every tensor as if it
    were (checked with torch 2.13 on the CPU: a transposed gradient gave a different update), and what it
    writes cannot be copied first. Gradients are made contiguous before the call instead."""
    return all(t.is_contiguous() for t in [*params, *state.exp_avg, *state.exp_avg_sq])


def adamw_update_(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: AdamWState,
    lr: torch.Tensor,
    grad_norm: torch.Tensor,
    decays: Sequence[float],
    config: TrainConfig,
    implementation: Implementation = "auto",
) -> torch.Tensor:
    """Clip, check and apply one AdamW update in place; returns whether it was applied (0-d bool).

    ``params``, ``grads`` and the state are local tensors; ``lr`` and ``grad_norm`` are 0-d
    tensors, so a captured step never recompiles for a new learning rate. The gradients are
    scaled by ``min(1, grad_clip / (grad_norm + 1e-6))`` when clipping is on. When
    ``grad_norm`` is not finite nothing changes (parameters, moments and step stay as they
    were), decided on the device without a host sync; the caller reads the flag later.
    ``implementation`` picks the kernel (``Implementation``); both compute the same rule.
    """
    finite = torch.isfinite(grad_norm)
    keep = finite.to(torch.float32)
    scale = keep
    if config.grad_clip > 0:  # a NaN norm must not leak through the factor: 0 x NaN is NaN
        scale = torch.where(finite, torch.clamp(config.grad_clip / (grad_norm + 1e-6), max=1.0), 0.0)
    step = state.step.add_(keep)
    tensors = [*params, *grads, *state.exp_avg, *state.exp_avg_sq]
    fused = implementation == "fused" or (
        implementation == "auto" and can_fuse(tensors) and _updated_in_place(params, state)
    )
    if fused:
        _fused_update_(params, grads, state, lr, decays, config, finite, scale)
        return finite
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


def _fused_update_(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: AdamWState,
    lr: torch.Tensor,
    decays: Sequence[float],
    config: TrainConfig,
    finite: torch.Tensor,
    scale: torch.Tensor,
) -> None:
    """``torch._fused_adamw_`` once per weight decay: the kernel divides each gradient by ``grad_scale``
    (the inverse of the clipping factor) and leaves every tensor as it was when ``found_inf`` is 1."""
    grad_scale = torch.where(finite, 1.0 / torch.where(finite, scale, 1.0), 1.0) if config.grad_clip > 0 else None
    found_inf = (~finite).to(torch.float32)
    op = fused_adamw_op()
    for decay in sorted(set(decays)):
        chosen = [index for index, value in enumerate(decays) if value == decay]
        op(
            [params[i] for i in chosen],
            [grads[i].contiguous() for i in chosen],  # a gradient's layout is the backward's (a transpose, say)
            [state.exp_avg[i] for i in chosen],
            [state.exp_avg_sq[i] for i in chosen],
            state.step,
            lr,
            grad_scale,
            found_inf,
            config.beta1,
            config.beta2,
            decay,
            config.eps,
        )
