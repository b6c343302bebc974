"""Activation memory policies: rewriting a captured step graph so the backward keeps less.

In a captured step the forward is every node the micro-batch losses depend on; the rest
(backward, clipping, AdamW) is the backward part. An *activation* is a forward node the
backward reads: unless something is done, it stays alive from its forward to its last
backward use. Each policy decides, per activation, one of:

- ``save``: keep it (the graph as captured).
- ``recompute``: drop it after the forward and compute it again, from kept values, just
  before its first backward use.
- ``offload``: copy it to host memory in the forward and back just before its first backward use.

Policies (``TrainConfig.memory_policy``):

- ``save``: everything is saved.
- ``recompute``: full activation checkpointing. Saved: block inputs (a block's output read
  by the next block) and activations outside the transformer blocks; everything computed
  inside a block is recomputed, parameter gathers included (also one a block starts for the
  next, with ``ParallelConfig.fsdp_prefetch``: gathered again, not kept).
- ``selective``: as ``recompute``, but matmul, attention and custom-kernel outputs are
  saved too, so only cheap ops (norms, activations, rotations, views) are recomputed.
- ``offload``: as ``recompute``, with the block inputs offloaded to host memory.

A block is one of the model's transformer blocks (``titanpod.graph.blocks``: ``layers.<i>`` of a decoder,
FLUX's double- and single-stream blocks), as ``capture_step`` recorded their paths in the graph's
``meta["block_paths"]``; a node's block is found through the ``nn_module_stack`` that ``make_fx`` records.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import fx

from titanpod.device.barriers import optimization_barrier
from titanpod.graph.blocks import BLOCK_PATHS
from titanpod.graph.capture import loss_outputs

aten = torch.ops.aten

MATMUL_OPS = frozenset(
    {
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten.baddbmm.default,
        aten._grouped_mm.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten.convolution.default,
    }
)
"""Ops whose outputs ``selective`` keeps: the expensive ones to recompute."""

_VIEW_OPS = frozenset(
    {
        aten.detach.default,
        aten.t.default,
        aten.view.default,
        aten._unsafe_view.default,
        aten.transpose.int,
        aten.permute.default,
        aten.expand.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.unsqueeze.default,
        aten.squeeze.dim,
    }
)
"""Ops whose output shares its input's memory (``_unsafe_view`` included: it is a view in all but name)."""
_BUILTIN_NAMESPACES = frozenset({"aten", "prims", "_c10d_functional", "c10d_functional"})
_BLOCK_PATH = re.compile(r"(?:^|\.)layers\.(\d+)$")
_ALL_GATHER = torch.ops._c10d_functional.all_gather_into_tensor.default


@dataclass
class ActivationPlan:
    """What a policy decided for the captured graph's activations (node names and bytes)."""

    policy: str
    """The policy applied."""
    saved: list[str] = field(default_factory=list)
    """Activations kept in device memory from forward to backward."""
    recomputed: list[str] = field(default_factory=list)
    """Activations dropped after the forward and recomputed in the backward."""
    offloaded: list[str] = field(default_factory=list)
    """Activations kept in host memory between forward and backward."""
    saved_bytes: int = 0
    """Bytes of ``saved`` (per process)."""
    recomputed_bytes: int = 0
    """Bytes of ``recomputed``."""
    offloaded_bytes: int = 0
    """Bytes of ``offloaded``."""


def node_bytes(node: fx.Node) -> int:
    """Bytes of the tensor(s) a node produces, from its traced metadata (0 if it has none)."""
    value = node.meta.get("val")
    values = value if isinstance(value, list | tuple) else [value]
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def block_of(node: fx.Node, block_paths: Sequence[str] | None = None) -> int | None:
    """Index of the transformer block a node was traced in (its place in ``block_paths``), or None outside every
    block. Without ``block_paths`` a block is a module whose path is ``layers.<i>``, and ``i`` its index."""
    stack = node.meta.get("nn_module_stack") or {}
    indices = None if block_paths is None else {path: index for index, path in enumerate(block_paths)}
    block = None
    for path, _ in stack.values():
        path = path.replace("L['self'].", "")
        if indices is not None:
            block = indices.get(path, block)
            continue
        match = _BLOCK_PATH.search(path)
        if match:
            block = int(match.group(1))
    return block


def _is_expensive(node: fx.Node) -> bool:
    target = node.target
    if target is operator.getitem:
        return isinstance(node.args[0], fx.Node) and _is_expensive(node.args[0])
    if target in MATMUL_OPS:
        return True
    namespace = getattr(target, "namespace", None)
    return namespace is not None and namespace not in _BUILTIN_NAMESPACES


def _memory_owner(node: fx.Node) -> fx.Node:
    """The node whose memory ``node`` lives in: itself, or the base it is a view of."""
    while node.target in _VIEW_OPS and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _mutates(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.is_mutable


def _random(node: fx.Node) -> bool:
    """Whether recomputing ``node`` could give another value (attention with dropout 0 is exact)."""
    if torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ()):
        return False
    schema = node.target._schema  # type: ignore[union-attr]
    for index, argument in enumerate(schema.arguments):
        if argument.name == "dropout_p":
            value = node.args[index] if index < len(node.args) else node.kwargs.get("dropout_p", argument.default_value)
            return value != 0.0
    return True


def _forward_nodes(graph: fx.Graph) -> tuple[set[fx.Node], set[fx.Node]]:
    """The forward's dataflow (every non-input node a micro-batch loss depends on) and the
    whole forward: that dataflow plus what autograd recorded beside it while the forward ran
    (``detach`` of values it saves, unused extra outputs), i.e. every node traced between a
    micro-batch's first forward node and its loss."""
    order = {node: index for index, node in enumerate(graph.nodes)}
    nodes = list(graph.nodes)
    dataflow: set[fx.Node] = set()
    forward: set[fx.Node] = set()
    for loss in loss_outputs(graph):
        own = _ancestors_of(loss) - dataflow
        dataflow |= own
        if own:
            forward.update(nodes[min(order[n] for n in own) : order[loss] + 1])
    return dataflow, {n for n in forward | dataflow if n.op not in ("placeholder", "get_attr")}  # inputs, constants


def _ancestors_of(node: fx.Node) -> set[fx.Node]:
    found: set[fx.Node] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if current in found or current.op == "placeholder":
            continue
        found.add(current)
        pending.extend(current.all_input_nodes)
    return found


def _keeps(
    node: fx.Node, policy: str, dataflow: set[fx.Node], pinned: set[fx.Node], blocks: dict[fx.Node, int | None]
) -> bool:
    """Whether ``policy`` keeps ``node`` (in device or host memory) rather than recomputing it; ``blocks``: each
    node's block (``block_of``)."""
    if policy == "save" or node.op == "placeholder" or node in pinned:
        return True
    block = blocks[node]
    if block is None:
        return True
    if node.target == _ALL_GATHER:
        return False  # parameters gathered ahead for the next block (FSDP prefetch): gathered again, not kept
    if any(user in dataflow and blocks[user] != block for user in node.users):
        return True  # a block input of the next block (or of the head)
    return policy == "selective" and _is_expensive(node)


def apply_memory_policy(graph_module: fx.GraphModule, policy: str, device_type: str) -> ActivationPlan:
    """Rewrite ``graph_module`` (a captured step) in place by ``policy``; returns what it decided.

    The plan is read off the rewritten graph: ``saved`` lists every forward value the
    backward still reads, including the kept inputs of recomputations.

    Where the device has an optimization barrier (``titanpod.device.barriers``), each kept value a recomputation
    reads passes through it with the backward value that asks for it, so that a compiler that merges equal ops
    cannot fold the recomputation back into the forward, and runs it no earlier than its first backward use.
    """
    barrier = optimization_barrier(device_type)
    graph = graph_module.graph
    block_paths = graph_module.meta.get(BLOCK_PATHS)
    blocks = {node: block_of(node, block_paths) for node in graph.nodes}
    dataflow, forward = _forward_nodes(graph)
    backward = [n for n in graph.nodes if n.op not in ("placeholder", "output") and n not in forward]
    backward_set = set(backward)
    activations = [n for n in graph.nodes if n in forward and any(u in backward_set for u in n.users)]
    # In-place forward ops and their inputs, and random ops, keep their one value.
    mutating = {n for n in forward if _mutates(n)}
    pinned = mutating | {arg for n in mutating for arg in n.all_input_nodes} | {n for n in forward if _random(n)}
    recompute_set = {n for n in forward if not _keeps(n, policy, dataflow, pinned, blocks)}
    offload_set = set()
    if policy == "offload":
        offload_set = {n for n in activations if n not in recompute_set and blocks[n] is not None}

    host_copies = {}
    for node in offload_set:
        with graph.inserting_after(node):
            host = graph.call_function(aten._to_copy.default, (node,), {"device": torch.device("cpu")})
        host.meta.update(node.meta, memory_policy="offload_to_host")
        host_copies[node] = host

    replacements: dict[fx.Node, fx.Node] = {}
    barriered: dict[fx.Node, fx.Node] = {}

    def kept_input(node: fx.Node, before: fx.Node) -> fx.Node:
        """``node``, a kept value a recomputation reads, through the barrier where there is one."""
        if barrier is None or not isinstance(node.meta.get("val"), torch.Tensor):
            return node
        if node not in barriered:
            asking = next((arg for arg in before.all_input_nodes if arg in backward_set and
                           isinstance(arg.meta.get("val"), torch.Tensor)), None)  # fmt: skip
            together = [node] if asking is None else [node, asking]
            with graph.inserting_before(before):
                passed = graph.call_function(barrier, (together,))
                value = graph.call_function(operator.getitem, (passed, 0))
            passed.meta.update(val=[n.meta["val"] for n in together], memory_policy="recompute_barrier")
            value.meta.update(val=node.meta["val"], memory_policy="recompute_barrier")
            barriered[node] = value
        return barriered[node]

    def recompute_input(node: fx.Node, before: fx.Node) -> fx.Node:
        value = backward_value(node, before)
        return kept_input(node, before) if value is node else value

    def backward_value(node: fx.Node, before: fx.Node) -> fx.Node:
        if node in replacements:
            return replacements[node]
        if node in host_copies:
            value = node.meta.get("val")
            device = value.device if isinstance(value, torch.Tensor) else torch.device(device_type)
            with graph.inserting_before(before):
                back = graph.call_function(aten._to_copy.default, (host_copies[node],), {"device": device})
            back.meta.update(node.meta, memory_policy="reload_from_host")
        elif node in recompute_set:
            with graph.inserting_before(before):
                back = graph.node_copy(node, lambda arg: recompute_input(arg, before))
            back.meta.update(node.meta, memory_policy="recompute", recomputed_from=node.name)
        else:
            return node
        replacements[node] = back
        return back

    for node in backward:
        node.args = fx.map_arg(node.args, lambda arg, node=node: backward_value(arg, node))
        node.kwargs = fx.map_arg(node.kwargs, lambda arg, node=node: backward_value(arg, node))
    graph.eliminate_dead_code()  # forward copies whose only readers were moved to recomputations
    graph.lint()
    graph_module.recompile()

    plan = ActivationPlan(policy)
    saved_roots = set()
    for node in graph.nodes:
        if node not in forward:
            continue
        if node in host_copies:
            plan.offloaded.append(node.name)
            plan.offloaded_bytes += node_bytes(node)
        elif any(u not in forward for u in node.users):
            plan.saved.append(node.name)
            saved_roots.add(_memory_owner(node))
    plan.saved_bytes = sum(node_bytes(root) for root in saved_roots if root.op != "placeholder")
    for node in activations:
        if node in recompute_set:
            plan.recomputed.append(node.name)
            plan.recomputed_bytes += node_bytes(node)
    graph_module.meta["activation_plan"] = plan
    return plan
