"""Context parallelism: each row's sequence split over the ``cp`` ranks, attention over keys gathered from all.

Legend: B batch, H query heads, K key/value heads, D head dim, S a whole row, s one rank's share
(S / cp), L a chunk (S / 2cp).

A row is cut into 2 x cp chunks and rank r keeps chunks r and 2cp-1-r: under a causal mask an
early chunk has few keys to see and a late one many, so every rank gets the same work. The
model embeds, rotates (at the row positions) and runs its blocks on its 2 chunks alone; each
attention gathers the keys and values of every rank (its gradient reduce-scatters them back) and
attends causally by position. The loss of each rank is weighted by its share of the labelled
tokens, so the mean over cp ranks is the loss of the whole row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from titanpod.models import IGNORE_INDEX, PositionedAttentionOp, SequenceChunks, positioned_form
from titanpod.parallel.config import check_sequence_length
from titanpod.parallel.errors import PlanError
from titanpod.parallel.torch_executor.collectives import _differentiable


def rank_chunks(rank: int, cp: int) -> tuple[int, int]:
    """The two chunks (of 2 x ``cp``) of every row that context-parallel rank ``rank`` holds."""
    return rank, 2 * cp - 1 - rank


def gathered_chunks(cp: int) -> tuple[int, ...]:
    """The chunks of a row in the order an all-gather over the cp ranks lays them out."""
    return tuple(chunk for rank in range(cp) for chunk in rank_chunks(rank, cp))


@dataclass(frozen=True)
class ContextParallelSequence:
    """The ``SequenceShard`` of cp rank ``rank``: chunks r and 2cp-1-r of every row."""

    rank: int
    """This rank's index on the cp axis."""
    cp: int
    """Context-parallel ranks."""

    def at(self, S: int) -> SequenceChunks:
        """Where this rank's tokens sit in a row of ``S``."""
        check_sequence_length(S, self.cp)
        return SequenceChunks(S // (2 * self.cp), rank_chunks(self.rank, self.cp))

    def local(self, x_BS: torch.Tensor) -> torch.Tensor:
        """This rank's two chunks of every row, [B, s]."""
        at = self.at(x_BS.shape[1])
        L = at.chunk_len
        return torch.cat([x_BS[:, c * L : (c + 1) * L] for c in at.chunks], dim=1)

    def positions(self, S: int, device: torch.device) -> torch.Tensor:
        """Row positions of this rank's tokens, [s]."""
        return self.at(S).positions(device)


def _gather_keys(x_BKsD: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_gather_single(x_BKsD.contiguous(), 2, mesh))


def _sum_scatter_keys(grad_BKSD: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return funcol.wait_tensor(funcol.reduce_scatter_single(grad_BKSD.contiguous(), "sum", 2, mesh))


gather_keys = _differentiable("GatherKeys", _gather_keys, _sum_scatter_keys)
"""Every cp rank's keys (or values) along the sequence, [B, K, s, D] -> [B, K, S, D] in the
all-gather's order; the gradient, holding every rank's queries' share, is summed back to each."""


@dataclass
class ContextParallelAttention:
    """An attention slot over a split sequence: local queries, every rank's keys and values."""

    positioned: PositionedAttentionOp
    """The attention op, in its positioned form."""
    mesh: DeviceMesh
    """The cp axis."""
    sequence: ContextParallelSequence
    """This rank's place on it."""

    def __call__(
        self,
        q_BHsD: torch.Tensor,
        k_BKsD: torch.Tensor,
        v_BKsD: torch.Tensor,
        document_ids_Bs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of this rank's queries over the whole row, [B, H, s, D]."""
        cp = self.sequence.cp
        q_at = self.sequence.at(q_BHsD.shape[2] * cp)
        k_at = SequenceChunks(q_at.chunk_len, gathered_chunks(cp))
        k_BKSD, v_BKSD = gather_keys(k_BKsD, self.mesh), gather_keys(v_BKsD, self.mesh)
        if document_ids_Bs is None:
            return self.positioned(q_BHsD, k_BKSD, v_BKSD, q_at, k_at)
        ids_BS = funcol.wait_tensor(funcol.all_gather_single(document_ids_Bs.contiguous(), 1, self.mesh))
        return self.positioned(q_BHsD, k_BKSD, v_BKSD, q_at, k_at, document_ids_Bs, ids_BS)


@dataclass
class ContextParallelHeadLoss:
    """A head + loss slot whose cp ranks' mean is the mean over the whole rows' labelled tokens.

    Each rank's mean is weighted by ``cp x`` its labelled tokens / all cp ranks' labelled tokens; a
    rank with none contributes 0 (not the NaN of an empty mean).
    """

    inner: Any
    """The head + loss op (mean over this rank's labelled tokens)."""
    mesh: DeviceMesh
    """The cp axis."""

    def __call__(self, h_BsM: torch.Tensor, weight_VM: torch.Tensor, labels_Bs: torch.Tensor) -> torch.Tensor:
        """This rank's weighted share of the rows' mean cross-entropy (fp32 scalar)."""
        mean = self.inner(h_BsM, weight_VM, labels_Bs)
        count = (labels_Bs != IGNORE_INDEX).sum().to(torch.float32)
        total = funcol.wait_tensor(funcol.all_reduce(count, "sum", self.mesh))
        weight = count * self.mesh.size() / total.clamp_min(1.0)
        return torch.where(count > 0, mean, torch.zeros_like(mean)) * weight


def _op_name(op: Any) -> str:
    """An op's name for a message: ``local_causal_sdpa.<locals>.attention``, ``TorchTpuSplashAttention``."""
    return getattr(op, "__qualname__", type(op).__name__)


def make_context_parallel(model: nn.Module, mesh: DeviceMesh) -> None:
    """Split ``model``'s sequence over ``mesh`` (the cp axis), in place: its sequence slot keeps this
    rank's chunks, every attention slot gathers keys and values, the loss is weighted per rank.

    ``PlanError`` for a model without the slots (``ops.sequence``, attention modules with
    ``attention_op``) or an attention op with no positioned form (e.g. local-window attention).
    """
    ops = getattr(model, "ops", None)
    if ops is None or not hasattr(ops, "sequence"):
        raise PlanError(f"Context parallelism needs a decoder with a sequence slot; {type(model).__name__} has none.")
    sequence = ContextParallelSequence(mesh.get_local_rank(), mesh.size())
    attentions = [module for module in model.modules() if hasattr(module, "attention_op")]
    for module in attentions:
        positioned = positioned_form(module.attention_op)
        if positioned is None:
            raise PlanError(
                f"Context parallelism cannot split this model's attention ({_op_name(module.attention_op)}): it needs "
                "kernels.attention splash, or sdpa without kernels.window; change one, or set parallel.cp 1."
            )
        module.attention_op = ContextParallelAttention(positioned, mesh, sequence)
    model.ops = dataclasses.replace(ops, sequence=sequence, head_loss=ContextParallelHeadLoss(ops.head_loss, mesh))  # type: ignore[assignment]
