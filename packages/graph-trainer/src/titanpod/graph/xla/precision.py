"""Mixed precision on the xla lane: torchax's bf16 autocast while the step is traced."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def bf16_autocast() -> Iterator[None]:
    """torchax's bf16 autocast (the op lists of ``torch.autocast``), while a step is traced.

    torchax's table is keyed by aten op, but torchax runs a few torch functions itself, before any aten op:
    ``F.linear`` (every projection of a model), ``F.scaled_dot_product_attention`` and ``torch.einsum``. Left
    out of the table they would run on float32 parameters in float32 and hand float32 activations on, at twice
    the bytes of ``torch.autocast``'s bf16 ones; they are put in it, as the matmuls they are, while tracing.

    torchax 0.0.14's "promote" cast reads the dtype of every positional argument, so it fails on ``cat`` and
    ``stack`` (their first argument is a list of tensors). Those two promote mixed dtypes by themselves (to the
    widest, as the cast would), so their entries are left out of the table while tracing. The table is as it was
    after.
    """
    import torchax
    from torchax import amp

    aten = torch.ops.aten
    lower = amp.CastPolicy.LOWER_PRECISION_FP
    matmul_functions = (torch.nn.functional.linear, torch.nn.functional.scaled_dot_product_attention, torch.einsum)
    before = dict(amp.autocast_policy)
    for op in (aten.cat.default, aten.stack.default):
        amp.autocast_policy.pop(op, None)
    amp.autocast_policy.update(dict.fromkeys(matmul_functions, lower))
    try:
        with amp.autocast("jax", torch.bfloat16, torchax.default_env()):
            yield
    finally:
        amp.autocast_policy.clear()
        amp.autocast_policy.update(before)
