"""The transformer blocks as one ``jax.lax.scan`` over stacked parameters, while the xla step is traced.

Legend: L blocks, B batch, S sequence, M model dim, N tokens (B x S), E experts.

The model runs its blocks through ``model.run_layers`` (``titanpod.models.Transformer``); here that
method is replaced, for the trace only, by a scan whose body is block 0 run on block i's slice of
the stacked parameters (``titanpod.graph.xla.layer_stack``). Block 0's forward is whatever the
step made of it (``rematerialised_blocks``: ``jax.checkpoint`` with the memory policy, the FSDP
gather inside), so each trip of the loop gathers, computes and is recomputed as one unrolled block
is. The program then holds one block's code however deep the model is. An MoE block's router logits
and dropped counts come out of the scan stacked [L, ...] and go back to the model as lists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from titanpod.graph.binding import parameters_bound


@contextlib.contextmanager
def scanned_layers(model: nn.Module, stacked: Sequence[Any]) -> Iterator[None]:
    """While tracing, run ``model``'s blocks as one ``lax.scan`` over ``stacked``: the JAX values of the blocks'
    parameters stacked [L, ...], in the order of block 0's ``named_parameters``."""
    blocks = getattr(model, "layers", None)
    if not isinstance(blocks, nn.ModuleList) or not hasattr(model, "run_layers"):
        raise ValueError(
            f"train.scan_layers needs a model whose blocks are in model.layers and run by model.run_layers "
            f"(titanpod.models.Transformer); {type(model).__name__} has no such pair. Set train.scan_layers=false."
        )
    template = blocks[0]
    count = len(list(template.parameters()))
    if count != len(stacked):
        raise ValueError(f"Block 0 has {count} parameters but {len(stacked)} stacked arrays were given.")

    def run_layers(
        h_BSM: torch.Tensor,
        cos_SD: torch.Tensor,
        sin_SD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        import jax
        from torchax.interop import jax_view, torch_view

        extra = () if document_ids_BS is None else (document_ids_BS,)

        def body(h_j: Any, slices_j: list[Any]) -> tuple[Any, Any]:
            with parameters_bound(template, torch_view(slices_j)):
                out_BSM, routing = template(torch_view(h_j), cos_SD, sin_SD, *extra)
            return jax_view(out_BSM), jax_view(routing)

        h_j, routing_L = jax.lax.scan(body, jax_view(h_BSM), list(stacked))
        if routing_L is None:
            return torch_view(h_j), [], []
        logits_LNE, dropped_L = routing_L
        layers = logits_LNE.shape[0]
        return (
            torch_view(h_j),
            [torch_view(logits_LNE[i]) for i in range(layers)],
            [torch_view(dropped_L[i]) for i in range(layers)],
        )

    model.run_layers = run_layers  # type: ignore[method-assign]
    try:
        yield
    finally:
        del model.run_layers
