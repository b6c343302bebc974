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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from titanpod.graph.binding import parameters_bound


@contextlib.contextmanager
def scanned_layers(model: nn.Module, stacked: Mapping[str, Sequence[Any]]) -> Iterator[None]:
    """While tracing, run each of ``model``'s block lists as one ``lax.scan`` over ``stacked``: each list's path
    (``layers``, ``transformer.double_blocks`` ...) -> the JAX values of its blocks' parameters stacked [L, ...],
    in the order of block 0's ``named_parameters``.

    A decoder (blocks in ``model.layers``, run by ``model.run_layers``) has its ``run_layers`` replaced; any other
    model's block lists (``titanpod.graph.blocks``) each iterate as one call that runs the loop (``_ScannedList``),
    so a model's own ``for block in self.blocks`` runs every block."""
    if set(stacked) == {"layers"} and hasattr(model, "run_layers"):
        with _scanned_decoder(model, stacked["layers"]):
            yield
        return
    swapped = []
    try:
        for path, arrays in stacked.items():
            blocks = model.get_submodule(path)
            if not isinstance(blocks, nn.ModuleList):
                raise ValueError(f"train.scan_layers: {path} is not a list of blocks (an nn.ModuleList).")
            _check_count(blocks[0], arrays)
            blocks.__class__ = _ScannedList
            blocks.scan_arrays = list(arrays)  # type: ignore[attr-defined]
            swapped.append(blocks)
        yield
    finally:
        for blocks in swapped:
            blocks.__class__ = nn.ModuleList
            del blocks.scan_arrays


def _check_count(template: nn.Module, stacked: Sequence[Any]) -> None:
    count = len(list(template.parameters()))
    if count != len(stacked):
        raise ValueError(f"Block 0 has {count} parameters but {len(stacked)} stacked arrays were given.")


class _ScannedList(nn.ModuleList):
    """A block list, while traced, as one call: iterating it gives ``run_all``, which runs block 0's forward on
    each block's slice of the stacked parameters (``scan_arrays``) in one ``lax.scan``. The tensors a block returns
    are carried to the next block in place of its leading arguments (FLUX's double-stream block returns its image
    and text streams, its first two arguments); the other arguments are the same for every block."""

    scan_arrays: list[Any]

    def __iter__(self) -> Iterator[Any]:
        yield self.run_all

    def run_all(self, *args: Any) -> Any:
        """Every block of the list, one after another, on ``args`` (the first block's arguments)."""
        import jax
        from torchax.interop import jax_view, torch_view

        template = self[0]
        arrays = self.scan_arrays

        def block(carried_j: list[Any], rest: tuple[Any, ...], slices_j: list[Any]) -> Any:
            with parameters_bound(template, torch_view(slices_j)):
                return template(*torch_view(carried_j), *rest)

        # How many leading arguments a block hands on: as many tensors as it returns.
        returned = jax.eval_shape(
            lambda slices_j: jax_view(block(jax_view(list(args)), (), slices_j)), [a[0] for a in arrays]
        )
        single = not isinstance(returned, (tuple, list))
        carried = 1 if single else len(returned)
        rest = args[carried:]

        def body(carry_j: list[Any], slices_j: list[Any]) -> tuple[list[Any], None]:
            out = jax_view(block(carry_j, rest, slices_j))
            return ([out] if single else list(out)), None

        final_j, _ = jax.lax.scan(body, jax_view(list(args[:carried])), list(arrays))
        return torch_view(final_j[0]) if single else tuple(torch_view(final_j))


@contextlib.contextmanager
def _scanned_decoder(model: nn.Module, stacked: Sequence[Any]) -> Iterator[None]:
    """A decoder's ``run_layers`` as one ``lax.scan`` over ``stacked`` (its blocks' parameters, stacked)."""
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
