"""torch's fused AdamW kernel as one custom op, so a captured step keeps it when it is compiled.

``torch._fused_adamw_`` with a tensor learning rate has no fake kernel, so inductor cannot
compile a graph that calls it; wrapped as ``titanpod::fused_adamw_`` (which declares what it
mutates and has a fake), the compiled step calls the kernel in place as one extern call,
instead of generating code for each parameter's update.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

OP_NAME = "titanpod::fused_adamw_"
"""The custom op's qualified name, as it appears in a captured graph (``torch.ops.titanpod.fused_adamw_``)."""


@functools.cache
def fused_adamw_op() -> Callable[..., None]:
    """The custom op (registered with torch on first use): arguments are the parameters, gradients, first and
    second moments (lists), the step count and learning rate (0-d), the gradient scale (0-d or ``None``), the
    NaN/Inf flag (0-d; 1 leaves every tensor as it was), then beta1, beta2, weight decay and eps."""

    @torch.library.custom_op(OP_NAME, mutates_args=("params", "exp_avg", "exp_avg_sq"))
    def fused_adamw_(
        params: list[Tensor],
        grads: list[Tensor],
        exp_avg: list[Tensor],
        exp_avg_sq: list[Tensor],
        step: Tensor,
        lr: Tensor,
        grad_scale: Tensor | None,
        found_inf: Tensor,
        beta1: float,
        beta2: float,
        weight_decay: float,
        eps: float,
    ) -> None:
        torch._fused_adamw_(
            params,
            grads,
            exp_avg,
            exp_avg_sq,
            [],
            [step] * len(params),  # the kernel reads the count (already advanced) and does not change it
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            weight_decay=weight_decay,
            eps=eps,
            amsgrad=False,
            maximize=False,
            grad_scale=grad_scale,
            found_inf=found_inf,
        )

    @fused_adamw_.register_fake
    def _(params, grads, exp_avg, exp_avg_sq, step, lr, grad_scale, found_inf, beta1, beta2, weight_decay, eps):
        return None

    return fused_adamw_
