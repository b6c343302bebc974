"""Folding the parts of a captured step that depend on no input into constants, computed once.

A captured step recomputes, every step, whatever the model computes from nothing but shapes:
rotary tables are the big one (``arange``, ``pow``, ``cos``, ``sin`` over the sequence). Left
in the graph, inductor fuses that arithmetic into each consumer, so every attention layer's
rotation, forward and backward, evaluates its trigonometry again per element: at the Llama 3
debug shape that was about an eighth of the compiled step's time on a CPU.

``fold_constants`` evaluates such subgraphs once, when the step is prepared, and replaces
them by tensors the graph reads (``get_attr``). Only subgraphs with costly arithmetic are
folded: index ranges, comparisons and masks stay in the graph, where fusing them into their
consumer costs less than reading a stored tensor. Nothing random, mutating or collective is
folded, and nothing larger than ``max_bytes``.
"""

from __future__ import annotations

import torch
from torch import fx
from torch.utils import _pytree as pytree

aten = torch.ops.aten

CHEAP_OPS = frozenset(
    {
        aten.arange.default,
        aten.arange.start,
        aten.arange.start_step,
        aten.full.default,
        aten.zeros.default,
        aten.ones.default,
        aten.empty.memory_format,
        aten.scalar_tensor.default,
        aten.lift_fresh_copy.default,
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.expand.default,
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten.slice.Tensor,
        aten.select.int,
        aten.permute.default,
        aten.t.default,
        aten.transpose.int,
        aten.detach.default,
        aten.alias.default,
        aten.clone.default,
        aten._to_copy.default,
        aten.add.Tensor,
        aten.add.Scalar,
        aten.sub.Tensor,
        aten.sub.Scalar,
        aten.mul.Tensor,
        aten.mul.Scalar,
        aten.neg.default,
        aten.remainder.Scalar,
        aten.floor_divide.default,
        aten.eq.Tensor,
        aten.eq.Scalar,
        aten.ne.Tensor,
        aten.ne.Scalar,
        aten.ge.Tensor,
        aten.ge.Scalar,
        aten.gt.Tensor,
        aten.gt.Scalar,
        aten.le.Tensor,
        aten.le.Scalar,
        aten.lt.Tensor,
        aten.lt.Scalar,
        aten.logical_and.default,
        aten.logical_or.default,
        aten.logical_not.default,
        aten.bitwise_and.Tensor,
        aten.bitwise_or.Tensor,
        aten.bitwise_not.default,
        aten.where.self,
    }
)
"""Ops that are cheaper to recompute inside the consumer's fused kernel than to read from memory:
a constant subgraph made of these alone stays in the graph."""

DEFAULT_MAX_BYTES = 64 << 20
"""The largest single tensor folded (64 MiB): a bigger constant costs more memory than it saves time."""


def fold_constants(graph_module: fx.GraphModule, max_bytes: int = DEFAULT_MAX_BYTES) -> list[str]:
    """Replace, in place, each costly input-free subgraph of ``graph_module`` by its value; returns the names of the
    constants added (``graph_module`` attributes, read through ``get_attr`` nodes)."""
    graph = graph_module.graph
    constant: set[fx.Node] = set()
    costly: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "get_attr" or (node.op == "call_function" and _foldable(node)):
            inputs = node.all_input_nodes
            if all(arg in constant for arg in inputs):
                constant.add(node)
                if (node.op == "call_function" and node.target not in CHEAP_OPS) or any(a in costly for a in inputs):
                    costly.add(node)
    frontier = [
        node
        for node in graph.nodes
        if node in costly
        and node.op != "get_attr"
        and any(user not in constant for user in node.users)
        and 0 < _bytes(node) <= max_bytes
    ]
    if not frontier:
        return []
    values = _evaluate(graph_module, frontier)
    added = []
    for index, node in enumerate(frontier):
        name = _free_name(graph_module, f"_folded_constant_{index}")
        graph_module.register_buffer(name, values[node], persistent=False)
        with graph.inserting_before(node):
            replacement = graph.get_attr(name)
        replacement.meta.update({key: node.meta[key] for key in ("val", "tensor_meta") if key in node.meta})
        node.replace_all_uses_with(replacement)
        added.append(name)
    for node in reversed(list(graph.nodes)):
        if node in constant and node.op == "call_function" and not node.users:
            graph.erase_node(node)
    graph_module.recompile()
    return added


def _foldable(node: fx.Node) -> bool:
    """An aten op that is deterministic, mutates nothing and communicates with no one."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return False
    return not (target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags)


def _bytes(node: fx.Node) -> int:
    """The size of the node's tensor value; 0 when its value is not one tensor (nothing to fold into a buffer)."""
    value = node.meta.get("val")
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def _evaluate(graph_module: fx.GraphModule, wanted: list[fx.Node]) -> dict[fx.Node, torch.Tensor]:
    """The real values of ``wanted`` (constant nodes), computed op by op from their constant ancestors."""
    needed: set[fx.Node] = set()
    stack = list(wanted)
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    env: dict[fx.Node, object] = {}
    for node in graph_module.graph.nodes:
        if node not in needed:
            continue
        if node.op == "get_attr":
            value: object = graph_module
            for part in str(node.target).split("."):
                value = getattr(value, part)
            env[node] = value
        else:
            args, kwargs = pytree.tree_map_only(fx.Node, env.__getitem__, (node.args, node.kwargs))
            env[node] = node.target(*args, **kwargs)  # type: ignore[operator]
    return {node: env[node].detach().clone() for node in wanted}  # type: ignore[union-attr]


def _free_name(graph_module: fx.GraphModule, name: str) -> str:
    candidate, suffix = name, 0
    while hasattr(graph_module, candidate):
        suffix += 1
        candidate = f"{name}_{suffix}"
    return candidate
