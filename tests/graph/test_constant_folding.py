"""Folding input-free arithmetic of a captured step into constants: what is folded, what is left, same results."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from titanpod.device import get_backend
from titanpod.graph import TrainConfig, build_step, steps
from titanpod.graph.constant_folding import fold_constants
from titanpod.models import DecoderArgs, Transformer

aten = torch.ops.aten


def _targets(graph_module):
    return {node.target for node in graph_module.graph.nodes if node.op == "call_function"}


def test_costly_input_free_arithmetic_is_folded_and_gives_the_same_values():
    def f(x):
        angles = torch.arange(8, dtype=torch.float32) * 0.5
        return x * angles.cos() + angles.sin()

    graph = make_fx(f)(torch.ones(8))
    x = torch.randn(8)
    expected = graph(x)
    added = fold_constants(graph)
    assert len(added) == 2  # cos and sin, each read by a node that depends on x
    assert aten.cos.default not in _targets(graph) and aten.arange.default not in _targets(graph)
    assert torch.equal(graph(x), expected)


def test_cheap_masks_random_values_and_large_tensors_stay_in_the_graph():
    def masked(x):
        positions = torch.arange(8)
        return x.masked_fill(positions[:, None] < positions[None, :], 0.0)

    def noisy(x):
        return x + torch.rand(8).cos()

    def large(x):
        return x + torch.arange(1024, dtype=torch.float32).cos()

    cases = ((masked, torch.ones(8, 8), 1 << 20), (noisy, torch.ones(8), 1 << 20), (large, torch.ones(1024), 1024))
    for function, example, max_bytes in cases:
        graph = make_fx(function)(example)
        before = _targets(graph)
        assert fold_constants(graph, max_bytes=max_bytes) == []
        assert _targets(graph) == before


def test_the_captured_step_reads_its_rotary_tables_as_constants_and_trains_exactly_as_before(monkeypatch):
    args = DecoderArgs(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=64, max_seq_len=16)
    tokens = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    results = []
    for fold in (True, False):
        if not fold:
            monkeypatch.setattr(steps, "fold_constants", lambda graph: [])
        model = Transformer(args)
        model.init_weights(0)
        config = TrainConfig(steps=2, warmup_steps=0, step_mode="whole_step", compiler="none")
        step = build_step(model, config, get_backend("cpu"))
        losses = [float(step([(tokens[:, :-1], tokens[:, 1:])], 1e-3).loss) for _ in range(2)]
        assert step.graph is not None
        trig = {aten.cos.default, aten.sin.default} & _targets(step.graph)
        assert (not trig) if fold else trig
        results.append((losses, [p.detach().clone() for p in model.parameters()]))
    (folded_losses, folded_params), (plain_losses, plain_params) = results
    assert folded_losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(folded_params, plain_params, strict=True))
