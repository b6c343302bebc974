"""The mixture-of-experts layer against a direct per-token computation and against the
dynamic-shape routing it replaced, its capacity and dropped tokens, and its auxiliary loss."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from titanpod.models import ModelOps, MoEArgs, batched_expert_matmul
from titanpod.models.common.moe import MoE, expert_capacity, load_balancing_loss
from titanpod.recipes.families import build_model


def moe_layer(norm_topk_prob: bool, ops: ModelOps | None = None, capacity_factor: float | None = None) -> MoE:
    torch.manual_seed(0)
    args = MoEArgs(n_experts=4, top_k=2, expert_ffn_dim=8, norm_topk_prob=norm_topk_prob,
                   capacity_factor=capacity_factor)  # fmt: skip
    layer = MoE(16, args, (ops or ModelOps()).expert_matmul)
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
        out_BSM, logits_NE, dropped = layer(x_BSM)
        assert logits_NE.shape == (10, 4) and int(dropped) == 0
        torch.testing.assert_close(out_BSM.flatten(0, 1), direct_moe(layer, x_BSM.flatten(0, 1), norm))


def test_expert_matmul_reference_multiplies_each_buffer_by_its_expert():
    x_ECI = torch.randn(4, 7, 3)
    w_EOI = torch.randn(4, 5, 3)
    out = batched_expert_matmul(x_ECI, w_EOI)
    for e in range(4):
        torch.testing.assert_close(out[e], x_ECI[e] @ w_EOI[e].T)


def test_expert_slot_receives_every_expert_buffer():
    calls = []

    def recording(x, w):
        calls.append(tuple(x.shape))
        return batched_expert_matmul(x, w)

    layer = moe_layer(True, ModelOps(expert_matmul=recording), capacity_factor=1.0)
    layer(torch.randn(1, 6, 16))
    assert calls == [(4, 3, 16), (4, 3, 16), (4, 3, 8)]  # gate, up, down; capacity ceil(6 x 2 / 4) = 3


def test_capacity_follows_the_factor_and_none_keeps_every_token():
    moe = MoEArgs(n_experts=8, top_k=2, expert_ffn_dim=4)
    assert expert_capacity(100, moe) == 100
    assert expert_capacity(100, dataclasses.replace(moe, capacity_factor=1.0)) == 25
    assert expert_capacity(100, dataclasses.replace(moe, capacity_factor=1.25)) == math.ceil(1.25 * 200 / 8)
    assert expert_capacity(100, dataclasses.replace(moe, capacity_factor=100.0)) == 100  # never more than N
    assert expert_capacity(3, dataclasses.replace(moe, capacity_factor=0.01)) == 1
    with pytest.raises(ValueError, match="capacity_factor must be positive"):
        MoEArgs(capacity_factor=0.0)


def dynamic_moe(layer: MoE, x_BSM: torch.Tensor) -> torch.Tensor:
    """The routing the layer had before capacities: rows sorted by expert, data-dependent group sizes."""
    args, experts = layer.args, layer.experts
    x_NM = x_BSM.flatten(0, 1)
    probs_NE = F.softmax(layer.router(x_NM), dim=-1, dtype=torch.float32)
    weights_NK, experts_NK = probs_NE.topk(args.top_k, dim=-1)
    if args.norm_topk_prob:
        weights_NK = weights_NK / weights_NK.sum(dim=-1, keepdim=True)
    order_T = experts_NK.flatten().argsort(stable=True)
    token_T = order_T // args.top_k
    sizes = torch.bincount(experts_NK.flatten(), minlength=args.n_experts).tolist()

    def grouped(x_TI: torch.Tensor, w_EOI: torch.Tensor) -> torch.Tensor:
        return torch.cat([group @ w_EOI[e].T for e, group in enumerate(torch.split(x_TI, sizes))])

    x_TM = x_NM[token_T]
    routed_TM = grouped(F.silu(grouped(x_TM, experts.w1)) * grouped(x_TM, experts.w3), experts.w2)
    weighted_TM = routed_TM * weights_NK.flatten()[order_T, None]
    return torch.zeros_like(x_NM).index_add_(0, token_T, weighted_TM).view_as(x_BSM)


def hand_counted_drops(experts_NK: torch.Tensor, n_experts: int, capacity: int) -> tuple[int, set[tuple[int, int]]]:
    """Walk the choices in priority order (every token's first choice, then second) counting each expert's rows."""
    filled, kept = [0] * n_experts, set()
    for k in range(experts_NK.shape[1]):
        for n in range(experts_NK.shape[0]):
            e = int(experts_NK[n, k])
            if filled[e] < capacity:
                filled[e] += 1
                kept.add((n, k))
    return experts_NK.numel() - len(kept), kept


def test_without_drops_the_static_layer_equals_the_dynamic_one_forward_and_backward():
    for factor in (None, 4.0):  # 4.0: capacity = N, every token fits
        layer = moe_layer(True, capacity_factor=factor)
        x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        out, _, dropped = layer(x)
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        grads = torch.autograd.grad((out * probe).sum(), [x, *layer.parameters()])
        want = dynamic_moe(layer, x)
        want_grads = torch.autograd.grad((want * probe).sum(), [x, *layer.parameters()])
        assert int(dropped) == 0
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
        for got, expected in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_a_small_capacity_drops_exactly_the_overflowing_choices_and_they_add_nothing():
    layer = moe_layer(False, capacity_factor=0.5)  # 20 tokens x 2 / 4 experts x 0.5: 5 rows per expert
    x_BSM = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(3))
    out_BSM, logits_NE, dropped = layer(x_BSM)
    experts_NK = logits_NE.softmax(-1).topk(2, dim=-1).indices
    count, kept = hand_counted_drops(experts_NK, 4, capacity=5)
    assert count > 0 and int(dropped) == count
    # The per-token computation with only the kept choices: dropped ones add exactly nothing.
    x_NM = x_BSM.flatten(0, 1)
    want = torch.zeros_like(x_NM)
    probs = F.softmax(logits_NE, dim=-1)
    for n, k in kept:
        e = int(experts_NK[n, k])
        w1, w2, w3 = layer.experts.w1[e], layer.experts.w2[e], layer.experts.w3[e]
        want[n] += probs[n, e] * (w2 @ (F.silu(w1 @ x_NM[n]) * (w3 @ x_NM[n])))
    torch.testing.assert_close(out_BSM.flatten(0, 1), want, rtol=1e-5, atol=1e-6)


def test_load_balancing_loss_is_top_k_when_balanced_and_larger_when_not():
    balanced = torch.zeros(8, 4)  # uniform router: every expert equally likely
    balanced[torch.arange(8), torch.arange(8) % 4] = 1e-3  # ...with ties broken evenly
    assert abs(load_balancing_loss([balanced], n_experts=4, top_k=1).item() - 1.0) < 1e-2
    collapsed = torch.zeros(8, 4)
    collapsed[:, 0] = 10.0  # every token to expert 0
    assert load_balancing_loss([collapsed], n_experts=4, top_k=1).item() > 3.5


def test_load_balancing_loss_pools_every_layers_tokens():
    torch.manual_seed(0)
    layers = [torch.randn(6, 4) for _ in range(3)]
    # by hand over the 18 pooled rows: f[k, e] the share of rows whose k-th choice is e, P[e] the mean probability
    pooled = torch.cat(layers).softmax(-1)
    chosen = pooled.topk(2, dim=-1).indices
    share_KE = torch.stack([torch.bincount(chosen[:, k], minlength=4).float() / 18 for k in range(2)])
    want = 4 * (share_KE * pooled.mean(dim=0)).sum()
    torch.testing.assert_close(load_balancing_loss(layers, n_experts=4, top_k=2), want)


def test_moe_model_loss_adds_the_weighted_auxiliary_term():
    model = build_model("qwen3_moe", "debug", device="cpu")
    model.init_weights(0)
    tokens = torch.randint(0, 2048, (2, 8))
    terms = model.loss_terms(tokens, tokens)
    assert model.args.moe is not None
    expected = terms["cross_entropy"] + model.args.moe.aux_loss_coef * terms["load_balancing"]
    torch.testing.assert_close(model.loss(tokens, tokens), expected)
    model.loss(tokens, tokens).backward()
    assert model.layers[0].feed_forward.router.weight.grad.abs().sum() > 0


def test_the_model_reports_dropped_tokens_of_every_layer_and_dense_models_report_none():
    model = build_model("qwen3_moe", "debug", device="cpu")
    model.init_weights(0)
    tokens = torch.randint(0, 2048, (2, 16), generator=torch.Generator().manual_seed(4))
    _, metrics = model.loss_and_metrics(tokens, tokens)
    assert metrics == {"dropped_tokens": 0}
    assert model.args.moe is not None
    small = dataclasses.replace(model.args, moe=dataclasses.replace(model.args.moe, capacity_factor=0.5))
    tight = build_model("qwen3_moe", small, device="cpu")
    tight.load_state_dict(model.state_dict())
    loss, metrics = tight.loss_and_metrics(tokens, tokens)
    _, router_logits, per_layer = tight.hidden_states_and_routing(tokens)
    capacity = expert_capacity(32, small.moe)
    by_hand = sum(
        hand_counted_drops(logits.softmax(-1).topk(2, dim=-1).indices, 8, capacity)[0] for logits in router_logits
    )
    assert int(metrics["dropped_tokens"]) == sum(int(d) for d in per_layer) == by_hand > 0
    torch.testing.assert_close(loss, tight.loss(tokens, tokens))
    dense = build_model("llama3", "debug", device="cpu")
    dense.init_weights(0)
    assert dense.loss_and_metrics(tokens, tokens)[1] == {}
