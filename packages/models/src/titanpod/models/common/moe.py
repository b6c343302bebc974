"""Mixture-of-experts feed-forward: top-k routing, SwiGLU experts, load-balancing loss.

Legend: B batch, S sequence, M model dim, N tokens (B x S), E experts, K experts per
token, F expert hidden dim, T routed rows (N x K), L layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titanpod.models.common.args import MoEArgs
from titanpod.models.common.ops import BatchMeanOp, ExpertMatmulOp, local_batch_mean


class GroupedExperts(nn.Module):
    """E SwiGLU experts stored as stacked weights, applied through the expert-matmul slot."""

    def __init__(self, dim: int, moe: MoEArgs, expert_matmul: ExpertMatmulOp) -> None:
        super().__init__()
        shape_up, shape_down = (moe.n_experts, moe.expert_ffn_dim, dim), (moe.n_experts, dim, moe.expert_ffn_dim)
        self.w1 = nn.Parameter(torch.empty(shape_up))
        self.w2 = nn.Parameter(torch.empty(shape_down))
        self.w3 = nn.Parameter(torch.empty(shape_up))
        self.expert_matmul = expert_matmul

    def forward(self, x_TM: torch.Tensor, group_sizes_E: torch.Tensor) -> torch.Tensor:
        gate_TF = self.expert_matmul(x_TM, self.w1, group_sizes_E)
        up_TF = self.expert_matmul(x_TM, self.w3, group_sizes_E)
        return self.expert_matmul(F.silu(gate_TF) * up_TF, self.w2, group_sizes_E)


class MoE(nn.Module):
    """Route each token to its top-k experts and sum their outputs weighted by router probability."""

    def __init__(self, dim: int, moe: MoEArgs, expert_matmul: ExpertMatmulOp) -> None:
        super().__init__()
        self.args = moe
        self.router = nn.Linear(dim, moe.n_experts, bias=False)
        self.experts = GroupedExperts(dim, moe, expert_matmul)

    def forward(self, x_BSM: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output [B, S, M] and its router logits [N, E] (for the auxiliary loss)."""
        x_NM = x_BSM.flatten(0, 1)
        logits_NE = self.router(x_NM)
        probs_NE = F.softmax(logits_NE, dim=-1, dtype=torch.float32)
        weights_NK, experts_NK = probs_NE.topk(self.args.top_k, dim=-1)
        if self.args.norm_topk_prob:
            weights_NK = weights_NK / weights_NK.sum(dim=-1, keepdim=True)
        order_T = experts_NK.flatten().argsort(stable=True)
        token_T = order_T // self.args.top_k
        group_sizes_E = torch.bincount(experts_NK.flatten(), minlength=self.args.n_experts)
        routed_TM = self.experts(x_NM[token_T], group_sizes_E)
        weighted_TM = routed_TM * weights_NK.flatten()[order_T, None].to(routed_TM.dtype)
        out_NM = torch.zeros_like(x_NM).index_add_(0, token_T, weighted_TM)
        return out_NM.view_as(x_BSM), logits_NE


def load_balancing_loss(
    router_logits: list[torch.Tensor], n_experts: int, top_k: int, batch_mean: BatchMeanOp = local_batch_mean
) -> torch.Tensor:
    """Switch-style auxiliary loss over all MoE layers' router logits, pooled (as Hugging Face does).

    ``E x sum_k sum_e f[k, e] x P[e]``: f is the fraction of tokens whose k-th choice is
    expert e, P the mean router probability of e, both over every token of every layer and,
    through ``batch_mean``, of the whole global batch. Equals ``top_k`` when routing is
    perfectly balanced.
    """
    probs_LNE = F.softmax(torch.cat(router_logits).float(), dim=-1)
    chosen = probs_LNE.topk(top_k, dim=-1).indices
    fraction_KE = batch_mean(F.one_hot(chosen, n_experts).float().mean(dim=0))
    mean_prob_E = batch_mean(probs_LNE.mean(dim=0))
    return n_experts * (fraction_KE * mean_prob_E).sum()
