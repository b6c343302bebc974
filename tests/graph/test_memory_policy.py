"""Memory policies on the captured step graph: what each saves, recomputes or offloads, and
what that does to the memory the step needs."""

from __future__ import annotations

from operator import getitem

import pytest
import torch
from torch import fx

from titanpod.device import get_backend
from titanpod.graph import TrainConfig, WholeStep
from titanpod.graph.graph_memory import peak_intermediate_bytes
from titanpod.graph.memory_policy import MATMUL_OPS, block_of
from titanpod.models import DecoderArgs, Transformer

aten = torch.ops.aten
MM = aten.mm.default


def prepared_step(policy: str, args: DecoderArgs, batch: int, seq: int) -> tuple[WholeStep, fx.GraphModule, tuple]:
    model = Transformer(args)
    model.init_weights(0)
    config = TrainConfig(step_mode="whole_step", memory_policy=policy, compiler="none")
    step = WholeStep(model, config, get_backend("cpu"))
    tokens = torch.randint(0, args.vocab_size, (1, batch, seq), generator=torch.Generator().manual_seed(0))
    graph = step.prepare(tokens, tokens)
    return step, graph, step._inputs(tokens, tokens, step.lr_tensor(1e-3))


ARGS = DecoderArgs(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=128, max_seq_len=256)


def nodes_by_name(graph: fx.GraphModule) -> dict[str, fx.Node]:
    return {node.name: node for node in graph.graph.nodes}


@pytest.fixture(scope="module", params=["save", "recompute", "selective", "offload"])
def captured(request):
    _, graph, _ = prepared_step(request.param, ARGS, batch=2, seq=16)
    return request.param, graph, graph.meta["activation_plan"], nodes_by_name(graph)


def test_each_policy_saves_recomputes_and_offloads_what_it_says(captured):
    policy, graph, plan, nodes = captured
    saved = [nodes[name] for name in plan.saved]
    saved_in_blocks = [n for n in saved if block_of(n) is not None]
    marks = [n.meta.get("memory_policy") for n in graph.graph.nodes]
    recomputed = [n for n in graph.graph.nodes if n.meta.get("memory_policy") == "recompute"]
    if policy == "save":
        assert not plan.recomputed and not plan.offloaded and set(marks) == {None}
        # Every block keeps its gated activation and an attention output, among many others.
        attention = aten._scaled_dot_product_flash_attention_for_cpu.default
        from_attention = [n for n in saved_in_blocks if n.target is getitem and n.args[0].target == attention]
        assert sorted({block_of(n) for n in from_attention}) == [0, 1, 2]
        assert sorted(block_of(n) for n in saved_in_blocks if n.target == aten.silu.default) == [0, 1, 2]
        assert len(saved_in_blocks) > 10 * ARGS.n_layers
        return
    assert plan.recomputed and recomputed
    # Recomputation happens in the backward: each copy runs after the loss it helped compute.
    loss_position = max(i for i, n in enumerate(graph.graph.nodes) if n.target == aten.nll_loss_forward.default)
    positions = {n: i for i, n in enumerate(graph.graph.nodes)}
    assert all(positions[n] > loss_position for n in recomputed)
    if policy == "selective":
        # Matmul and attention outputs are kept; only cheap ops are recomputed.
        assert any(n.target == MM for n in saved_in_blocks)
        assert not any(n.target in MATMUL_OPS for n in recomputed)
        assert any(n.target == aten.mul.Tensor for n in recomputed)
    else:
        # Full recompute: inside a block only its output (the next block's input) survives,
        # and the block's matmuls run again in the backward.
        assert any(n.target == MM for n in recomputed)
        kept_in_blocks = saved_in_blocks if policy == "recompute" else [nodes[name] for name in plan.offloaded]
        assert len(kept_in_blocks) == ARGS.n_layers
        assert all(n.target == aten.add.Tensor for n in kept_in_blocks)
    if policy == "offload":
        assert not saved_in_blocks
        to_host = [n for n in graph.graph.nodes if n.meta.get("memory_policy") == "offload_to_host"]
        reloads = [n for n in graph.graph.nodes if n.meta.get("memory_policy") == "reload_from_host"]
        assert len(to_host) == len(reloads) == ARGS.n_layers
        assert all(n.kwargs["device"] == torch.device("cpu") and n.target == aten._to_copy.default for n in to_host)
        assert all(positions[n] > loss_position for n in reloads)


def test_recompute_lowers_the_memory_a_step_needs():
    """Long sequences on a narrow model, so activations outweigh the gradients."""
    args = DecoderArgs(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=256, max_seq_len=512)
    peaks = {}
    for policy in ("save", "selective", "recompute"):
        _, graph, inputs = prepared_step(policy, args, batch=4, seq=512)
        peaks[policy] = peak_intermediate_bytes(graph, *inputs)
    assert peaks["recompute"] < 0.6 * peaks["save"], peaks
    assert peaks["recompute"] < peaks["selective"] < peaks["save"], peaks


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_the_policies_find_each_micro_batch_loss_whatever_metrics_the_model_reports(moe):
    """A captured step's outputs are stored flattened: an MoE model's metrics add nodes, a dense model's none."""
    from titanpod.graph.capture import loss_outputs
    from titanpod.models import MoEArgs

    args = (
        ARGS if not moe else DecoderArgs(**{**ARGS.__dict__, "moe": MoEArgs(n_experts=4, top_k=2, expert_ffn_dim=32)})
    )
    model = Transformer(args)
    model.init_weights(0)
    step = WholeStep(
        model, TrainConfig(step_mode="whole_step", memory_policy="recompute", compiler="none"), get_backend("cpu")
    )
    tokens = torch.randint(0, args.vocab_size, (2, 2, 16), generator=torch.Generator().manual_seed(0))
    graph = step.prepare(tokens, tokens)
    losses = loss_outputs(graph.graph)
    assert len(losses) == 2 and all(node.meta["val"].dtype == torch.float32 for node in losses)
    assert graph.meta["activation_plan"].recomputed
