"""The model's loss as a JAX function, through torchax: what the xla step differentiates, and what its
held-out evaluation runs forward."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from titanpod.graph.blocks import transformer_blocks
from titanpod.graph.config import TrainConfig
from titanpod.graph.loss_metrics import loss_and_metrics
from titanpod.graph.xla.head import head_parameter, regathered_head
from titanpod.graph.xla.layer_stack import LayerStack
from titanpod.graph.xla.precision import bf16_autocast
from titanpod.graph.xla.remat import BlockGather, rematerialised_blocks
from titanpod.graph.xla.scan import scanned_layers


def jax_loss(
    model: nn.Module,
    config: TrainConfig,
    layer_stack: LayerStack,
    policy: Any,
    gather: BlockGather | None,
    layout_input: Callable[[Any], Any] | None,
    cross_entropy_only: bool = False,
    gradient_sums: bool = False,
) -> Callable[..., Any]:
    """The model's loss as a JAX function of (parameters list, tokens [B, S], labels [B, S][, document ids [B, S]]),
    or of (parameters list, a dict of named tensors) for a model whose ``loss`` takes named tensors, returning
    (loss, metrics): the figures the model reports beside it (``titanpod.graph.loss_metrics``).

    The parameters are the step's entries (``layer_stack``). Runs ``model.loss`` through ``jax_view`` of
    ``torch.func.functional_call``, under torchax's bf16 autocast when ``config.precision`` is bf16 (matmuls
    in bf16; parameters and gradients stay fp32), with each transformer block rematerialised by the remat
    ``policy`` and gathering its parameters by ``gather`` (``titanpod.graph.xla.gather``), its input laid out
    by ``layout_input``; with stacked entries, the blocks run as one scan over their stacked parameters.
    ``cross_entropy_only``: the model's cross-entropy alone (``loss_terms``: no auxiliary MoE loss), as
    validation reports it, with no metrics. ``gradient_sums``: a function of (parameters list, running sums of
    gradients shaped as it, the batch) whose blocks' loop adds into the stacked entries' sums as it differentiates
    (``titanpod.graph.xla.gradient_sums``): its gradient with respect to a stacked entry is that entry's sum plus
    the true gradient, to any other entry the true gradient (the other sums are not read).
    """
    from torchax.interop import jax_view, torch_view

    wrapper = _LossModule(model, cross_entropy_only)
    names = list(layer_stack.entries)
    stacked = [layer_stack.is_stacked(i) for i in range(len(names))]
    # Blocks gather their own parameters (stacked ones inside the scan), and the head + loss slot its head
    # (regathered for its backward); the rest (embeddings, final norm) are gathered up front, a tied head
    # too, for the embedding's use.
    head = head_parameter(model) if gather is not None else None
    tables = {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.Embedding)}
    block_prefixes = tuple(f"{path}." for path, _ in transformer_blocks(model))
    outside = [
        gather is not None and not in_stack and not name.startswith(block_prefixes)
        and (name != head or name in tables)
        for name, in_stack in zip(names, stacked, strict=True)
    ]  # fmt: skip

    def torch_loss(
        params: list[torch.Tensor],
        tokens_BS: torch.Tensor | dict[str, torch.Tensor],
        labels_BS: torch.Tensor | None = None,
        document_ids_BS: torch.Tensor | None = None,
        sums: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        stored = params
        if gather is not None:
            params = [
                torch_view(gather(name, jax_view(param))) if up_front else param
                for name, param, up_front in zip(names, params, outside, strict=True)
            ]
        bound = {"inner." + n: p for n, p, s in zip(names, params, stacked, strict=True) if not s}
        inputs: tuple = (tokens_BS, labels_BS) if document_ids_BS is None else (tokens_BS, labels_BS, document_ids_BS)
        named: Mapping[str, torch.Tensor] = {}
        if isinstance(tokens_BS, Mapping):  # a batch of named tensors: model.loss(**batch)
            inputs, named = (), tokens_BS
        with contextlib.ExitStack() as stack:
            if head is not None and gather is not None:
                at = names.index(head)
                stack.enter_context(regathered_head(model, head, lambda: params[at], jax_view(stored[at]), gather))
            if config.precision == "bf16":
                stack.enter_context(bf16_autocast())
            if policy is not None or gather is not None:
                stack.enter_context(rematerialised_blocks(model, wrapper, policy, gather, layout_input))
            if any(stacked):
                blocks = {path: jax_view(arrays) for path, arrays in layer_stack.by_list(params).items()}
                running = None
                if sums is not None:
                    running = {path: jax_view(arrays) for path, arrays in layer_stack.by_list(sums).items()}
                stack.enter_context(scanned_layers(model, blocks, running))
            return torch.func.functional_call(wrapper, bound, inputs, named)

    if not gradient_sums:
        return jax_view(torch_loss)

    def torch_loss_summing(params: list[torch.Tensor], sums: list[torch.Tensor], *batch: Any) -> Any:
        return torch_loss(params, *batch, sums=sums)

    return jax_view(torch_loss_summing)


class _LossModule(nn.Module):
    """``model.loss`` and its metrics as a module's forward, for ``torch.func.functional_call``."""

    def __init__(self, inner: nn.Module, cross_entropy_only: bool = False) -> None:
        super().__init__()
        self.inner = inner
        self.cross_entropy_only = cross_entropy_only

    def forward(
        self,
        tokens_BS: torch.Tensor | None = None,
        labels_BS: torch.Tensor | None = None,
        document_ids_BS: torch.Tensor | None = None,
        **named: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if named:
            return loss_and_metrics(self.inner, **named)
        if self.cross_entropy_only:
            terms = self.inner.loss_terms(tokens_BS, labels_BS, document_ids_BS)  # type: ignore[operator]
            return terms["cross_entropy"], {}
        if document_ids_BS is None:
            return loss_and_metrics(self.inner, tokens_BS, labels_BS)
        return loss_and_metrics(self.inner, tokens_BS, labels_BS, document_ids_BS=document_ids_BS)
