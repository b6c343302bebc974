"""The figures a model reports beside its loss (e.g. an MoE model's dropped tokens), for every step mode.

A model may have ``loss_and_metrics(...) -> (loss, {name: 0-d tensor})`` taking the same
arguments as its ``loss``; ``titanpod.models.Transformer`` does, and its MoE flavors report
``dropped_tokens``. A model without it (or a dense model) reports nothing, and its steps
compute exactly what they did before.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

DROPPED_TOKENS = "dropped_tokens"
"""The name of an MoE model's count of routed (token, expert) choices dropped for lack of expert capacity."""


def loss_and_metrics(model: nn.Module, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``model.loss_and_metrics(*args, **kwargs)`` when the model has it, else ``(model.loss(...), {})``."""
    both = getattr(model, "loss_and_metrics", None)
    if both is None:
        return model.loss(*args, **kwargs), {}  # type: ignore[operator]
    loss, metrics = both(*args, **kwargs)
    return loss, {name: value.detach() for name, value in metrics.items()}


def add_metrics(total: dict[str, Any] | None, metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` added name by name to ``total`` (``None``: nothing yet), for summing over micro-batches."""
    if total is None:
        return dict(metrics)
    return {name: total[name] + value for name, value in metrics.items()}
