"""The swappable ops behind a model's slots, and their PyTorch references.

Legend: B batch, S sequence, H query heads, K key/value heads, D head dim, M model dim,
V vocabulary, E experts, C rows per expert (its capacity), I input width, O output width,
F expert hidden width.

A model takes a ``ModelOps`` when it is built; other layers (titanpod.kernels) provide
faster ops with the same signatures and prove them equal to these references.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from titanpod.models.common.block_runner import BlockRunner, blocks_in_order
from titanpod.models.common.sequence import (
    PositionedAttentionOp,
    SequenceShard,
    WholeSequence,
    positioned_sdpa_attention,
)

IGNORE_INDEX = -100
"""Label value that contributes nothing to the loss (padding, prompts)."""


class AttentionOp(Protocol):
    """Causal self-attention over already-projected, already-rotated heads.

    With ``document_ids_BS`` (packed sequences: equal within a document, increasing along
    the row), a query attends only to keys at or before it in its own document.
    """

    def __call__(
        self,
        q_BHSD: torch.Tensor,
        k_BKSD: torch.Tensor,
        v_BKSD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return the attended values, shape [B, H, S, D]; H is a multiple of K (GQA)."""
        ...


class HeadLossOp(Protocol):
    """Output projection and mean token cross-entropy, fused or not."""

    def __call__(self, h_BSM: torch.Tensor, weight_VM: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
        """Return the mean cross-entropy over labels that are not ``IGNORE_INDEX`` (fp32 scalar)."""
        ...


class ExpertMatmulOp(Protocol):
    """Grouped matmul over fixed-size buffers: each expert's C rows meet that expert's weight.

    Every shape is static (no group sizes read back from the device), so the op traces into
    a captured step, runs under ``jax.jit`` and splits evenly over expert-parallel ranks.
    Rows an expert did not receive are zeros and give zeros.
    """

    def __call__(self, x_ECI: torch.Tensor, w_EOI: torch.Tensor) -> torch.Tensor:
        """Return [E, C, O]: ``x_ECI[e] @ w_EOI[e].T`` for every expert e."""
        ...


class ExpertSwigluOp(Protocol):
    """Every expert's whole SwiGLU MLP over its fixed-size buffer of rows, as one op.

    An expert-matmul op may offer one as its ``swiglu`` attribute (``swiglu_experts_of``): it can then move
    each expert's rows to where that expert's weights are once for the three matmuls, not once for each.
    """

    def __call__(
        self, x_ECM: torch.Tensor, w1_EFM: torch.Tensor, w3_EFM: torch.Tensor, w2_EMF: torch.Tensor
    ) -> torch.Tensor:
        """Return [E, C, M]: ``(silu(x_ECM[e] @ w1_EFM[e].T) * (x_ECM[e] @ w3_EFM[e].T)) @ w2_EMF[e].T``."""
        ...


class BatchMeanOp(Protocol):
    """Mean of per-batch statistics over the whole global batch."""

    def __call__(self, statistic: torch.Tensor) -> torch.Tensor:
        """Return the statistic averaged over every process's share of the batch (same shape)."""
        ...


def local_batch_mean(statistic: torch.Tensor) -> torch.Tensor:
    """Reference batch mean: the whole batch is on this process, so the statistic already is it."""
    return statistic


def document_causal_mask(document_ids_BS: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask [B, 1, S, S]: query i may see key j when j <= i and both lie in one document.

    The diagonal is always allowed, so no query row is fully masked (no NaN from softmax).
    """
    S = document_ids_BS.shape[1]
    i_S = torch.arange(S, device=document_ids_BS.device)
    causal_SS = i_S[None, :] <= i_S[:, None]
    same_document_BSS = document_ids_BS[:, :, None] == document_ids_BS[:, None, :]
    return (same_document_BSS & causal_SS).unsqueeze(1)


def sdpa_attention(
    q_BHSD: torch.Tensor,
    k_BKSD: torch.Tensor,
    v_BKSD: torch.Tensor,
    document_ids_BS: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference attention: ``torch.nn.functional.scaled_dot_product_attention``, causal, GQA.

    With ``document_ids_BS`` the mask is causal and same-document (``document_causal_mask``);
    without, SDPA runs with ``is_causal=True``.
    """
    if document_ids_BS is None:
        return F.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, is_causal=True, enable_gqa=True)
    mask_B1SS = document_causal_mask(document_ids_BS)
    return F.scaled_dot_product_attention(q_BHSD, k_BKSD, v_BKSD, attn_mask=mask_B1SS, enable_gqa=True)


def linear_cross_entropy(h_BSM: torch.Tensor, weight_VM: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
    """Reference head + loss: full logits, then ``F.cross_entropy`` in fp32."""
    logits_BSV = F.linear(h_BSM, weight_VM)
    return F.cross_entropy(logits_BSV.flatten(0, 1).float(), labels_BS.flatten(), ignore_index=IGNORE_INDEX)


def batched_expert_matmul(x_ECI: torch.Tensor, w_EOI: torch.Tensor) -> torch.Tensor:
    """Reference expert matmul: one batched matmul, ``x_ECI[e] @ w_EOI[e].T`` for every expert e."""
    return torch.bmm(x_ECI, w_EOI.transpose(1, 2))


def swiglu_experts(
    x_ECM: torch.Tensor,
    w1_EFM: torch.Tensor,
    w3_EFM: torch.Tensor,
    w2_EMF: torch.Tensor,
    expert_matmul: ExpertMatmulOp = batched_expert_matmul,
) -> torch.Tensor:
    """Reference SwiGLU experts: gate, up and down as three calls of ``expert_matmul``, [E, C, M].

    Zero rows (buffer slots no token filled) give zero rows: SiLU(0) x 0 = 0."""
    gate_ECF = expert_matmul(x_ECM, w1_EFM)
    up_ECF = expert_matmul(x_ECM, w3_EFM)
    return expert_matmul(F.silu(gate_ECF) * up_ECF, w2_EMF)


def swiglu_experts_of(expert_matmul: ExpertMatmulOp) -> ExpertSwigluOp:
    """The expert-matmul op's ``swiglu`` when it has one, else ``swiglu_experts`` through the op."""
    offered = getattr(expert_matmul, "swiglu", None)
    if offered is not None:
        return offered

    def through_matmul(
        x_ECM: torch.Tensor, w1_EFM: torch.Tensor, w3_EFM: torch.Tensor, w2_EMF: torch.Tensor
    ) -> torch.Tensor:
        return swiglu_experts(x_ECM, w1_EFM, w3_EFM, w2_EMF, expert_matmul)

    return through_matmul


def positioned_form(attention: AttentionOp) -> PositionedAttentionOp | None:
    """The form of an attention op that attends by absolute position (``titanpod.models.common.sequence``):
    its ``at_positions`` attribute, ``positioned_sdpa_attention`` for the SDPA reference, else ``None``."""
    if attention is sdpa_attention:
        return positioned_sdpa_attention
    return getattr(attention, "at_positions", None)


@dataclass(frozen=True)
class ModelOps:
    """The ops a model calls through its slots. Defaults are the PyTorch references."""

    attention: AttentionOp = sdpa_attention
    """Attention slot (titanpod.kernels offers Splash attention)."""
    head_loss: HeadLossOp = linear_cross_entropy
    """Output head + loss slot (titanpod.kernels offers a fused, chunked version)."""
    expert_matmul: ExpertMatmulOp = batched_expert_matmul
    """Expert matmul slot of MoE layers (titanpod.kernels offers a grouped-matmul kernel)."""
    batch_mean: BatchMeanOp = local_batch_mean
    """Averages batch statistics (MoE routing loads) over a batch split across processes;
    titanpod.parallel installs an all-reduce here, so sharded training balances the global batch."""
    sequence: SequenceShard = field(default_factory=WholeSequence)
    """Which tokens of each row the model computes, at which positions: all of them, or (context
    parallelism, installed by titanpod.parallel) this process's chunks of every row."""
    block_runner: BlockRunner = blocks_in_order
    """Runs the transformer blocks (``titanpod.models.common.block_runner``): a Python loop, or (the xla step's
    ``train.scan_layers``, installed while its step is traced) one loop over the blocks' stacked parameters."""
