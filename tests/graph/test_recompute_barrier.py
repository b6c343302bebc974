"""Recomputation behind an optimization barrier: where a device's compiler merges equal ops (XLA, for torch_tpu's
graphs), the kept values a recomputation reads pass through a barrier, with the backward value that asks for them.

A CPU op that copies its inputs stands in for torch_tpu's ``tpu::_optimization_barrier`` here; envs/tpu checks the
real op's signature.
"""

from __future__ import annotations

import operator

import pytest
import torch

from tests.graph.test_memory_policy import ARGS, prepared_step
from titanpod.device.barriers import optimization_barrier


@pytest.fixture(scope="module")
def stand_in_barrier():
    library = torch.library.Library("titanpod_barrier_test", "DEF")
    library.define("barrier(Tensor[] values) -> Tensor[]")
    library.impl("barrier", lambda values: [value.clone() for value in values], "CPU")
    library.impl("barrier", lambda values: [torch.empty_like(value) for value in values], "Meta")
    yield torch.ops.titanpod_barrier_test.barrier.default
    del library


@pytest.fixture
def with_barrier(stand_in_barrier, monkeypatch):
    monkeypatch.setattr(
        "titanpod.graph.memory_policy.optimization_barrier",
        lambda device_type: stand_in_barrier if device_type == "cpu" else None,
    )
    return stand_in_barrier


def test_only_the_tpu_device_has_a_barrier_and_only_once_torch_tpu_provides_it():
    assert optimization_barrier("cpu") is None and optimization_barrier("jax") is None
    assert optimization_barrier("tpu") is None  # torch_tpu is not installed here


def test_every_kept_value_a_recomputation_reads_comes_through_the_barrier(with_barrier):
    _, graph, _ = prepared_step("recompute", ARGS, batch=2, seq=16)
    nodes = list(graph.graph.nodes)
    barriers = [n for n in nodes if n.target == with_barrier]
    recomputed = [n for n in nodes if n.meta.get("memory_policy") == "recompute"]
    assert barriers and recomputed
    through_barrier = {n for n in nodes if n.target is operator.getitem and n.args[0] in barriers}
    for node in recomputed:
        for arg in node.all_input_nodes:
            if isinstance(arg.meta.get("val"), torch.Tensor):
                assert arg in through_barrier or arg.meta.get("memory_policy") == "recompute", (node, arg)
    # Each barrier after the first also takes the backward value that asked for the recomputation.
    positions = {n: i for i, n in enumerate(nodes)}
    loss_position = max(i for i, n in enumerate(nodes) if n.target == torch.ops.aten.nll_loss_forward.default)
    assert all(positions[b] > loss_position for b in barriers)
    assert sum(len(b.args[0]) == 2 for b in barriers) >= ARGS.n_layers


def test_the_save_policy_places_no_barrier(with_barrier):
    _, graph, _ = prepared_step("save", ARGS, batch=2, seq=16)
    assert not [n for n in graph.graph.nodes if n.target == with_barrier]


def test_a_step_behind_barriers_computes_exactly_what_it_does_without(with_barrier, monkeypatch):
    _, barred, inputs = prepared_step("recompute", ARGS, batch=2, seq=16)
    monkeypatch.setattr("titanpod.graph.memory_policy.optimization_barrier", lambda device_type: None)
    _, plain, _ = prepared_step("recompute", ARGS, batch=2, seq=16)
    assert not [n for n in plain.graph.nodes if n.target == with_barrier]

    def fresh(values):
        return tuple([v.clone() for v in value] if isinstance(value, list) else value.clone() for value in values)

    ours, theirs = barred(*fresh(inputs)), plain(*fresh(inputs))
    flat_ours, flat_theirs = torch.utils._pytree.tree_leaves(ours), torch.utils._pytree.tree_leaves(theirs)
    assert len(flat_ours) == len(flat_theirs)
    assert all(torch.equal(a, b) for a, b in zip(flat_ours, flat_theirs, strict=True))
