"""Validation loss: the model's cross-entropy on held-out batches, without touching its weights."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from titanpod.graph import TrainConfig, TrainStep
from titanpod.graph.capture import autocast_context
from titanpod.models import Transformer


def validation_loss(
    model: Transformer,
    batches: Iterable[tuple[torch.Tensor, ...]],
    device: torch.device,
    train: TrainConfig,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    step: TrainStep | None = None,
) -> float:
    """Mean cross-entropy over ``batches`` (the auxiliary MoE loss left out) with the model on ``device``,
    in the run's precision.

    ``reduce`` averages the result over data-parallel ranks when each holds its own share of
    the held-out data; every rank must then call this together. A ``step`` that keeps the trained
    parameters on devices of its own (``evaluates_held_out``: the xla lane) computes each batch's loss
    there, with its kernels compiled for those devices; ``model`` is then not used.
    """
    if step is not None and step.evaluates_held_out:
        losses = [torch.as_tensor(float(step.held_out_loss(batch))) for batch in batches]
    else:
        losses = []
        with torch.no_grad(), autocast_context(train, device.type):
            for batch in batches:
                tokens_BS, labels_BS, *document_ids = (tensor.to(device) for tensor in batch)
                losses.append(model.loss_terms(tokens_BS, labels_BS, *document_ids)["cross_entropy"].float())
    if not losses:
        raise ValueError("There are no validation batches: raise data.validation_batches or hold out more data.")
    mean = torch.stack(losses).mean()
    return float(reduce(mean) if reduce is not None else mean)
