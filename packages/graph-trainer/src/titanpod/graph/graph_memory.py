"""Measuring a graph's memory: the peak of live intermediate tensors while it runs."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_leaves


class _LiveBytesInterpreter(fx.Interpreter):
    """Runs a graph node by node, freeing each value after its last use, and records the peak
    of the bytes held by values that are not graph inputs (storages counted once)."""

    def __init__(self, module: fx.GraphModule, input_storages: set[int]) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.input_storages = input_storages
        self.peak_bytes = 0

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        storages: dict[int, int] = {}
        for value in [*self.env.values(), result]:
            for leaf in tree_leaves(value):
                if isinstance(leaf, torch.Tensor):
                    storage = leaf.untyped_storage()
                    if storage.data_ptr() not in self.input_storages:
                        storages[storage.data_ptr()] = storage.nbytes()
        self.peak_bytes = max(self.peak_bytes, sum(storages.values()))
        return result


def peak_intermediate_bytes(graph_module: fx.GraphModule, *inputs: Any) -> int:
    """Run ``graph_module`` on ``inputs`` (it may update them in place, as a step does) and
    return the largest number of bytes its intermediate values held at once.

    This is the memory a graph needs beyond its inputs, the figure activation memory
    policies change; it is exact for the graph as written (a compiler may fuse and free sooner).
    """
    input_storages = {
        leaf.untyped_storage().data_ptr() for leaf in tree_leaves(inputs) if isinstance(leaf, torch.Tensor)
    }
    interpreter = _LiveBytesInterpreter(graph_module, input_storages)
    interpreter.run(*inputs)
    return interpreter.peak_bytes
