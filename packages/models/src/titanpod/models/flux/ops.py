"""The swappable ops behind the FLUX.1 transformer's slots (attention, block runner), and their PyTorch references.

Legend: B batch, H heads, S joint sequence (text tokens then image tokens), D head dim.

FLUX attends jointly over text and image tokens with no mask: every token sees every
other. Other layers (titanpod.kernels) may offer a faster op with the same signature and
prove it equal to ``full_sdpa_attention``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from titanpod.models.common.block_runner import BlockRunner, blocks_in_order


class FullAttentionOp(Protocol):
    """Non-causal, unmasked attention over already-projected, already-rotated heads."""

    def __call__(self, q_BHSD: torch.Tensor, k_BHSD: torch.Tensor, v_BHSD: torch.Tensor) -> torch.Tensor:
        """Return the attended values, shape [B, H, S, D] (softmax scale ``1/sqrt(D)``)."""
        ...


def full_sdpa_attention(q_BHSD: torch.Tensor, k_BHSD: torch.Tensor, v_BHSD: torch.Tensor) -> torch.Tensor:
    """Reference attention: ``torch.nn.functional.scaled_dot_product_attention``, no mask, not causal."""
    return F.scaled_dot_product_attention(q_BHSD, k_BHSD, v_BHSD)


@dataclass(frozen=True)
class FluxOps:
    """The ops a FLUX transformer calls through its slots. Defaults are the PyTorch references."""

    attention: FullAttentionOp = full_sdpa_attention
    """Joint text-image attention slot of every double- and single-stream block."""
    block_runner: BlockRunner = blocks_in_order
    """Runs each list of blocks, double- then single-stream (``titanpod.models.common.block_runner``)."""
