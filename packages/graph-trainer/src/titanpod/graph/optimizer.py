"""AdamW with decay on matrices only."""

from __future__ import annotations

import torch
from torch import nn

from titanpod.graph.config import TrainConfig


def build_adamw(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over ``model``'s parameters: weight decay on tensors of 2+ dims, none on norms."""
    decayed = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    plain = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decayed, "weight_decay": config.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, foreach=True)
