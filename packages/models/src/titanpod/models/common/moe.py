"""Mixture-of-experts feed-forward: top-k routing into fixed-capacity expert buffers, SwiGLU experts,
load-balancing loss.

Legend: B batch, S sequence, M model dim, N tokens (B x S), E experts, K experts per
token, F expert hidden dim, T routed choices (K x N, all first choices, then all second
choices, ...), C rows per expert (its capacity), R rows of all experts' buffers (E x C), L layers.

Every shape is fixed by the batch shape and ``MoEArgs``: each expert gets a buffer of C
rows, filled in order of choice, and a choice that finds its expert's buffer full is
dropped (it adds nothing; the residual carries the token on). Nothing depends on where the
router sent tokens, and nothing is read back to the host, so the layer traces into a
captured step, runs under ``jax.jit`` and splits evenly over expert-parallel ranks.

Tokens are routed by batch shard: each shard of the batch (the whole batch on one device)
fills its own E buffers of C rows from its own tokens, C from its own token count, and takes
its own rows back. The expert-matmul op may say what the shards are (``per_batch_shard``:
on the xla lane, the mesh's data shards, each routed where its tokens are); without it the
batch is one shard. Either way a process of the torch lanes routes the tokens it holds, so
every lane drops the same choices. The experts then see the G shards' buffers as one
[E, G x C, M] buffer, shard-major.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from titanpod.models.common.args import MoEArgs
from titanpod.models.common.ops import BatchMeanOp, ExpertMatmulOp, local_batch_mean, swiglu_experts_of


def expert_capacity(n_tokens: int, moe: MoEArgs) -> int:
    """Rows each expert's buffer holds for a layer input of ``n_tokens`` tokens.

    ``ceil(capacity_factor x n_tokens x top_k / n_experts)``, at least 1 and at most
    ``n_tokens`` (a token picks distinct experts, so no expert ever gets more); with
    ``capacity_factor=None``, ``n_tokens``: nothing is dropped.
    """
    if moe.capacity_factor is None:
        return n_tokens
    return max(1, min(n_tokens, math.ceil(moe.capacity_factor * n_tokens * moe.top_k / moe.n_experts)))


class Routing(NamedTuple):
    """Where each routed choice goes in the experts' buffers."""

    slot_T: torch.Tensor
    """Row of the flattened [E x C] buffers each choice fills; E x C (a spare row past the end) when dropped."""
    dropped: torch.Tensor
    """Choices dropped because their expert's buffer was full, 0-d integer."""


def route(experts_NK: torch.Tensor, n_experts: int, capacity: int) -> Routing:
    """Give each choice the next free row of its expert's buffer, first choices first; drop what does not fit.

    A choice's row is the number of earlier choices (in the order T: choice rank, then token)
    of the same expert: a cumulative sum over one-hot choices, with static shapes throughout.
    """
    experts_T = experts_NK.T.flatten()
    one_hot_TE = F.one_hot(experts_T, n_experts).to(torch.int32)
    position_T = (one_hot_TE.cumsum(0, dtype=torch.int32) - 1).gather(1, experts_T[:, None]).squeeze(1)
    kept_T = position_T < capacity
    slot_T = torch.where(kept_T, experts_T * capacity + position_T, n_experts * capacity)
    return Routing(slot_T, (~kept_T).sum())


class BatchShards(Protocol):
    """Runs a function of batch-major tensors once per shard of the batch."""

    def __call__(self, fn: Callable[..., tuple[torch.Tensor, ...]], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``fn`` on each shard's slice of ``tensors`` (split along their first dimension: rows of the batch,
        or shards); its outputs, each with a leading dimension of one a shard, stacked along it in shard
        order: [G, ...]."""
        ...


def one_batch_shard(fn: Callable[..., tuple[torch.Tensor, ...]], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The whole batch as one shard (``BatchShards`` with G = 1)."""
    return fn(*tensors)


def batch_shards_of(expert_matmul: Any) -> BatchShards:
    """The expert-matmul op's ``per_batch_shard`` when it has one, else ``one_batch_shard``."""
    return getattr(expert_matmul, "per_batch_shard", None) or one_batch_shard


def dispatch(
    x_BSM: torch.Tensor, experts_BSK: torch.Tensor, moe: MoEArgs
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch shard's routed buffers [1, E, C, M] (C from its B x S tokens), where each choice went
    [1, T], and how many choices were dropped [1]."""
    E, K = moe.n_experts, moe.top_k
    x_NM = x_BSM.flatten(0, 1)
    N, M = x_NM.shape
    C = expert_capacity(N, moe)
    slot_T, dropped = route(experts_BSK.flatten(0, 1), E, C)
    # A dropped choice adds zeros to the last row, not to a spare row: no buffer one row too long to cut back.
    kept_T1 = (slot_T < E * C)[:, None].to(x_NM.dtype)
    rows_TM = x_NM.repeat(K, 1) * kept_T1
    buffers_ECM = x_NM.new_zeros(E * C, M).index_add(0, slot_T.clamp(max=E * C - 1), rows_TM).view(E, C, M)
    return buffers_ECM.unsqueeze(0), slot_T.unsqueeze(0), dropped.reshape(1)


def combine(done_1ECM: torch.Tensor, slot_1T: torch.Tensor, weights_BSK: torch.Tensor) -> tuple[torch.Tensor]:
    """One batch shard's output [B, S, M]: each token's K expert rows, weighted by its router weights."""
    B, S, K = weights_BSK.shape
    _, E, C, M = done_1ECM.shape
    slot_T = slot_1T[0]
    # A dropped choice reads the last row with weight zero (no copy of the buffers with a zero row appended).
    weights_T = torch.where(slot_T < E * C, weights_BSK.flatten(0, 1).T.flatten(), 0)
    rows_RM = done_1ECM.reshape(E * C, M)
    weighted_TM = rows_RM[slot_T.clamp(max=E * C - 1)] * weights_T[:, None].to(rows_RM.dtype)
    return (weighted_TM.view(K, B * S, M).sum(dim=0).view(B, S, M),)


class GroupedExperts(nn.Module):
    """E SwiGLU experts stored as stacked weights, applied through the expert-matmul slot (its whole-MLP
    ``swiglu`` when it offers one, see ``swiglu_experts_of``)."""

    def __init__(self, dim: int, moe: MoEArgs, expert_matmul: ExpertMatmulOp) -> None:
        super().__init__()
        shape_up, shape_down = (moe.n_experts, moe.expert_ffn_dim, dim), (moe.n_experts, dim, moe.expert_ffn_dim)
        self.w1 = nn.Parameter(torch.empty(shape_up))
        self.w2 = nn.Parameter(torch.empty(shape_down))
        self.w3 = nn.Parameter(torch.empty(shape_up))
        self.expert_matmul = expert_matmul

    @property
    def gathers_own_parameters(self) -> bool:
        """Whether the expert-matmul op gathers this module's sharded weights itself (its ``gathers_weights``): a
        step that gathers each block's parameters for it (FSDP) then hands these over as stored."""
        return bool(getattr(self.expert_matmul, "gathers_weights", False))

    def forward(self, x_ECM: torch.Tensor) -> torch.Tensor:
        """Each expert's SwiGLU over its own buffer of rows: [E, C, M] -> [E, C, M] (zero rows stay zero)."""
        return swiglu_experts_of(self.expert_matmul)(x_ECM, self.w1, self.w3, self.w2)


class MoE(nn.Module):
    """Route each token to its top-k experts and sum their outputs weighted by router probability."""

    def __init__(self, dim: int, moe: MoEArgs, expert_matmul: ExpertMatmulOp) -> None:
        super().__init__()
        self.args = moe
        self.router = nn.Linear(dim, moe.n_experts, bias=False)
        self.experts = GroupedExperts(dim, moe, expert_matmul)

    def forward(self, x_BSM: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's output [B, S, M], its router logits [N, E] (for the auxiliary loss), and
        the number of choices dropped for lack of capacity (0-d integer)."""
        E, K = self.args.n_experts, self.args.top_k
        B, S, M = x_BSM.shape
        logits_NE = self.router(x_BSM.flatten(0, 1))
        probs_NE = F.softmax(logits_NE, dim=-1, dtype=torch.float32)
        weights_NK, experts_NK = probs_NE.topk(K, dim=-1)
        if self.args.norm_topk_prob:
            weights_NK = weights_NK / weights_NK.sum(dim=-1, keepdim=True)
        shards = batch_shards_of(self.experts.expert_matmul)
        args = self.args

        def dispatch_shard(x: torch.Tensor, experts: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return dispatch(x, experts, args)

        buffers_GECM, slot_GT, dropped_G = shards(dispatch_shard, x_BSM, experts_NK.reshape(B, S, K))
        G, _, C, _ = buffers_GECM.shape
        done_ECM = self.experts(buffers_GECM.transpose(0, 1).reshape(E, G * C, M))
        done_GECM = done_ECM.reshape(E, G, C, M).transpose(0, 1)
        (out_BSM,) = shards(combine, done_GECM, slot_GT, weights_NK.reshape(B, S, K))
        return out_BSM, logits_NE, dropped_G.sum()


def load_balancing_loss(
    router_logits: list[torch.Tensor], n_experts: int, top_k: int, batch_mean: BatchMeanOp = local_batch_mean
) -> torch.Tensor:
    """Switch-style auxiliary loss over all MoE layers' router logits, pooled (as Hugging Face does).

    ``E x sum_k sum_e f[k, e] x P[e]``: f is the fraction of tokens whose k-th choice is
    expert e, P the mean router probability of e, both over every token of every layer and,
    through ``batch_mean``, of the whole global batch. Equals ``top_k`` when routing is
    perfectly balanced.

    The layers' logits are stacked on a new leading dimension, not concatenated along the token one: every
    layer routes the same tokens, so the means are the same, and the token dimension (split over the data
    ranks) keeps its layout; concatenated, it would be cut at other boundaries than each layer's, which the
    compiler reshuffles between chips piece by piece (tens of GiB a chip for 94 layers).
    """
    probs_LNE = F.softmax(torch.stack(router_logits).float(), dim=-1)
    chosen_LNK = probs_LNE.topk(top_k, dim=-1).indices
    fraction_KE = batch_mean(F.one_hot(chosen_LNK, n_experts).float().mean(dim=(0, 1)))
    mean_prob_E = batch_mean(probs_LNE.mean(dim=(0, 1)))
    return n_experts * (fraction_KE * mean_prob_E).sum()
