"""AdamW as one JAX program over every parameter, for a device where each eager op is a dispatch of its own.

On the tpu lane (torch_tpu 0.2.0) an eager op costs about 0.1 ms however small it is, and ``adamw_update_``'s
tensor-by-tensor rule is some sixteen ops a parameter: for Qwen 3 0.6B's 311 tensors, 0.78 s a step on a v5e, more
than half the compiled step's own time. Here the same rule is one JAX function over the lists of parameters,
gradients and moments, run through torch_tpu's ``jax_op`` bridge as a single program that writes into the donated
buffers of the parameters, the moments and the step count, so it holds no second copy of them. Each tensor passed
for those then takes its new buffer (``tensor.data = new``), so the parameters stay the model's own objects.

The rule is ``adamw_update_``'s, written in JAX: the same clipping, skip on a non-finite norm, bias corrections and
decoupled weight decay (tests/graph/test_adamw_program.py compares the two).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from titanpod.graph.config import TrainConfig
from titanpod.graph.optimizer import AdamWState
from titanpod.kernels.jax_program import JaxProgram

LISTS = ("params", "grads", "exp_avg", "exp_avg_sq")
ARRAYS = ("step", "lr", "grad_norm")
DONATED = ("params", "exp_avg", "exp_avg_sq", "step")
"""What the program takes (lists of arrays, then 0-d arrays) and which of them it writes its outputs into."""


def adamw_rule(config: TrainConfig, decays: Sequence[float]) -> Callable[..., tuple[Any, ...]]:
    """``adamw_update_``'s rule as a JAX function of ``LISTS`` then ``ARRAYS`` (in that order), returning the new
    parameters (in their dtype), the fp32 first and second moments, the new step count and whether the
    update was applied (0-d bool), as one flat tuple. ``decays`` is each parameter's weight decay."""
    beta1, beta2, eps, clip = config.beta1, config.beta2, config.eps, config.grad_clip
    decays = tuple(decays)

    def update(params, grads, exp_avg, exp_avg_sq, step, lr, grad_norm):
        import jax.numpy as jnp

        finite = jnp.isfinite(grad_norm)
        keep = finite.astype(jnp.float32)
        scale = jnp.where(finite, jnp.minimum(clip / (grad_norm + 1e-6), 1.0), 0.0) if clip > 0 else keep
        step = step + keep
        counted = jnp.maximum(step, 1.0)  # a skipped first step must not divide by zero
        bias1 = 1.0 - jnp.power(beta1, counted)
        bias2_sqrt = jnp.sqrt(1.0 - jnp.power(beta2, counted))
        step_size = lr * keep / bias1
        new_params, new_m, new_v = [], [], []
        for param, grad, m, v, decay in zip(params, grads, exp_avg, exp_avg_sq, decays, strict=True):
            grad = jnp.where(finite, grad.astype(jnp.float32), 0.0) * scale
            m = m + (1.0 - beta1) * keep * (grad - m)
            v = v * (1.0 - (1.0 - beta2) * keep) + grad * grad * (1.0 - beta2)
            denom = jnp.sqrt(v) / bias2_sqrt + eps
            if decay:
                param = (param * (1.0 - lr * keep * decay)).astype(param.dtype)
            new_params.append(param - (step_size * m / denom).astype(param.dtype))
            new_m.append(m)
            new_v.append(v)
        return (*new_params, *new_m, *new_v, step, finite)

    return update


def program_name(config: TrainConfig, decays: Sequence[float]) -> str:
    """The op's name, ``titanpod::adamw_program_<digest>``: one per rule (its constants and decays)."""
    key = repr((config.beta1, config.beta2, config.eps, config.grad_clip, tuple(decays)))
    return f"titanpod::adamw_program_{hashlib.blake2b(key.encode(), digest_size=8).hexdigest()}"


class AdamWProgram:
    """One AdamW update of every parameter as one program (see the module's docstring)."""

    def __init__(self, config: TrainConfig, decays: Sequence[float]) -> None:
        self.decays = list(decays)
        self.program = JaxProgram(program_name(config, decays), adamw_rule(config, decays), LISTS, ARRAYS, DONATED)
        """The rule as one program: a torch_tpu op for tensors on the ``tpu`` device, ``jax.jit`` on the host
        elsewhere (``titanpod.kernels.jax_program``)."""

    def __call__(
        self,
        params: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        state: AdamWState,
        lr: torch.Tensor,
        grad_norm: torch.Tensor,
    ) -> torch.Tensor:
        """Apply the update to ``params`` and ``state`` (plain tensors, not DTensors); whether it was applied
        (0-d bool). Every tensor passed for the parameters, the moments and the step count holds its new value
        afterwards; another tensor that shared one's buffer (a ``detach()`` of a parameter) does not."""
        if len(params) != len(self.decays):
            raise ValueError(f"AdamWProgram was built for {len(self.decays)} parameters, got {len(params)}.")
        written = [*params, *state.exp_avg, *state.exp_avg_sq, state.step]
        outputs = self.program(
            list(params),
            [grad.contiguous() for grad in grads],
            list(state.exp_avg),
            list(state.exp_avg_sq),
            state.step,
            lr,
            grad_norm.to(torch.float32),
        )
        if len(outputs) != len(written) + 1:
            raise RuntimeError(f"The AdamW program returned {len(outputs)} tensors, expected {len(written) + 1}.")
        for tensor, new in zip(written, outputs, strict=False):
            tensor.data = new
        return outputs[-1]
