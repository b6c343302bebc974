"""The mixture-of-experts layer against a direct per-token computation, and its auxiliary loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from titanpod.models import ModelOps, MoEArgs, looped_grouped_matmul
from titanpod.models.common.moe import MoE, load_balancing_loss


def moe_layer(norm_topk_prob: bool, ops: ModelOps | None = None) -> MoE:
    torch.manual_seed(0)
    layer = MoE(16, MoEArgs(n_experts=4, top_k=2, expert_ffn_dim=8, norm_topk_prob=norm_topk_prob),
                (ops or ModelOps()).expert_matmul)  # fmt: skip
    for param in layer.parameters():
        torch.nn.init.normal_(param, std=0.3)
    return layer


def direct_moe(layer: MoE, x_NM: torch.Tensor, norm_topk_prob: bool) -> torch.Tensor:
    """Each token on its own: softmax router, top-2, weighted sum of its experts' SwiGLU."""
    out = torch.zeros_like(x_NM)
    for n, x_M in enumerate(x_NM):
        probs = F.softmax(layer.router.weight @ x_M, dim=-1)
        weights, experts = probs.topk(2)
        if norm_topk_prob:
            weights = weights / weights.sum()
        for weight, e in zip(weights, experts.tolist(), strict=True):
            w1, w2, w3 = layer.experts.w1[e], layer.experts.w2[e], layer.experts.w3[e]
            out[n] += weight * (w2 @ (F.silu(w1 @ x_M) * (w3 @ x_M)))
    return out


def test_routing_and_expert_outputs_match_a_per_token_computation():
    for norm in (True, False):
        layer = moe_layer(norm)
        x_BSM = torch.randn(2, 5, 16)
        out_BSM, logits_NE = layer(x_BSM)
        assert logits_NE.shape == (10, 4)
        torch.testing.assert_close(out_BSM.flatten(0, 1), direct_moe(layer, x_BSM.flatten(0, 1), norm))


def test_grouped_matmul_reference_handles_empty_and_uneven_groups():
    x_TI = torch.randn(7, 3)
    w_EOI = torch.randn(4, 5, 3)
    sizes = torch.tensor([3, 0, 4, 0])
    out = looped_grouped_matmul(x_TI, w_EOI, sizes)
    torch.testing.assert_close(out[:3], x_TI[:3] @ w_EOI[0].T)
    torch.testing.assert_close(out[3:], x_TI[3:] @ w_EOI[2].T)


def test_expert_slot_receives_every_grouped_matmul():
    calls = []

    def recording(x, w, sizes):
        calls.append(int(sizes.sum()))
        return looped_grouped_matmul(x, w, sizes)

    layer = moe_layer(True, ModelOps(expert_matmul=recording))
    layer(torch.randn(1, 6, 16))
    assert calls == [12, 12, 12]  # gate, up, down over 6 tokens x top-2


def test_load_balancing_loss_is_top_k_when_balanced_and_larger_when_not():
    balanced = torch.zeros(8, 4)  # uniform router: every expert equally likely
    balanced[torch.arange(8), torch.arange(8) % 4] = 1e-3  # ...with ties broken evenly
    assert abs(load_balancing_loss([balanced], n_experts=4, top_k=1).item() - 1.0) < 1e-2
    collapsed = torch.zeros(8, 4)
    collapsed[:, 0] = 10.0  # every token to expert 0
    assert load_balancing_loss([collapsed], n_experts=4, top_k=1).item() > 3.5


def test_moe_model_loss_adds_the_weighted_auxiliary_term():
    from titanpod.models import build_model

    model = build_model("qwen3_moe", "debug", device="cpu")
    model.init_weights(0)
    tokens = torch.randint(0, 2048, (2, 8))
    terms = model.loss_terms(tokens, tokens)
    assert model.args.moe is not None
    expected = terms["cross_entropy"] + model.args.moe.aux_loss_coef * terms["load_balancing"]
    torch.testing.assert_close(model.loss(tokens, tokens), expected)
    model.loss(tokens, tokens).backward()
    assert model.layers[0].feed_forward.router.weight.grad.abs().sum() > 0
