"""Mixed precision on the xla lane: torchax's bf16 autocast while the step is traced."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def bf16_autocast() -> Iterator[None]:
    """torchax's bf16 autocast (the op lists of ``torch.autocast``), while a step is traced.

    torchax 0.0.14's "promote" cast reads the dtype of every positional argument, so it
    fails on ``cat`` and ``stack`` (their first argument is a list of tensors). Those two
    promote mixed dtypes by themselves (to the widest, as the cast would), so their entries
    are left out of the table while tracing and put back after.
    """
    import torchax
    from torchax import amp

    aten = torch.ops.aten
    removed = {
        op: amp.autocast_policy.pop(op) for op in (aten.cat.default, aten.stack.default) if op in amp.autocast_policy
    }
    try:
        with amp.autocast("jax", torch.bfloat16, torchax.default_env()):
            yield
    finally:
        amp.autocast_policy.update(removed)
