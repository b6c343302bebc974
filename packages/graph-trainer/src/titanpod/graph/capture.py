"""Capturing a whole training step (forward, loss, backward, clipping, AdamW) as one FX graph.

Legend: A micro-batches per step, B batch, S sequence.

The step is traced with ``make_fx`` on fake tensors, so tracing costs no compute and no
memory. Its inputs are plain local tensors: each parameter's local shard, the AdamW
state, the learning rate, the step's tokens and labels, and (packed sequences) their
document ids. A sharded parameter is rebuilt as a DTensor inside the trace
(``DTensor.from_local``), so the gathers and gradient reductions of ``titanpod.parallel``
land in the graph as functional collectives.

Graph outputs: ``(grad_norm, applied, metrics, loss_1, ..., loss_A)``, ``metrics`` a dict of
the figures the model reports beside its loss, summed over the micro-batches (empty for most
models; see ``titanpod.graph.loss_metrics``); parameters and optimizer state are updated in place.
``loss_outputs`` finds the loss nodes again, which is how the
memory policies tell the forward part of the graph from the backward part.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.distributed.tensor import DTensor
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from titanpod.graph.binding import parameters_bound
from titanpod.graph.blocks import BLOCK_PATHS, transformer_blocks
from titanpod.graph.config import TrainConfig
from titanpod.graph.loss_metrics import add_metrics, loss_and_metrics
from titanpod.graph.optimizer import AdamWState, adamw_update_, shard_like, total_grad_norm

LEADING_OUTPUTS = 3
"""Outputs before the per-micro-batch losses: the gradient norm, the applied flag (or, with the update after the
program, the local gradients) and the metrics dict."""


@dataclass(frozen=True)
class ParamSpec:
    """How a captured step rebuilds one parameter from its local tensor."""

    dtensor: DTensor | None
    """The live sharded parameter (for its mesh, placements, shape and stride), or None if whole."""
    decay: float
    """Its weight decay."""

    def rebuild(self, local: torch.Tensor) -> torch.Tensor:
        """The tensor the model should read: ``local`` itself, or a DTensor over it."""
        return local if self.dtensor is None else shard_like(local, self.dtensor)


def autocast_context(config: TrainConfig, device_type: str) -> contextlib.AbstractContextManager[None]:
    """bf16 autocast when ``config.precision`` asks for it, else nothing."""
    if config.precision == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def step_function(
    model: nn.Module,
    specs: Sequence[ParamSpec],
    config: TrainConfig,
    device_type: str,
    document_ids: bool = False,
    named: bool = False,
    update: bool = True,
):
    """The functional step that ``capture_step`` traces (also runnable as it is, eagerly).

    Arguments: local parameters, first moments, second moments (lists), the step count
    and learning rate (0-d), tokens and labels [A, B, S], and, with ``document_ids``, the
    document ids [A, B, S] (each micro-batch's loss is then ``model.loss(..., document_ids_BS=...)``).
    With ``named``, the batch is instead one dict of named tensors, each stacked over the A
    micro-batches in its first dimension; micro-batch ``a``'s loss is ``model.loss(**{name: value[a]})``
    (a diffusion objective's batch: latents, noise, timesteps, conditioning).
    Without ``update`` the step stops before AdamW and returns the local gradients where it returns the applied
    flag; parameters and moments are then left as they were, for the caller to update.
    """
    decays = [spec.decay for spec in specs]

    def run(params, exp_avg, exp_avg_sq, step_count, lr, micro_batches, micro_batch_loss):
        leaves = [p.detach().requires_grad_(True) for p in params]
        bound = [spec.rebuild(leaf) for spec, leaf in zip(specs, leaves, strict=True)]
        losses, grads, metrics = [], None, None
        for index in range(micro_batches):
            with parameters_bound(model, bound), autocast_context(config, device_type):
                loss, batch_metrics = micro_batch_loss(index)
            metrics = add_metrics(metrics, batch_metrics)
            micro_grads = torch.autograd.grad(loss / micro_batches, bound)
            grads = list(micro_grads) if grads is None else [g + m for g, m in zip(grads, micro_grads, strict=True)]
            losses.append(loss.detach())
        assert grads is not None
        grad_norm = total_grad_norm(grads)
        local_grads = [_local_grad(g, spec) for g, spec in zip(grads, specs, strict=True)]
        if not update:
            return (grad_norm, local_grads, metrics, *losses)
        state = AdamWState(step_count, list(exp_avg), list(exp_avg_sq))
        applied = adamw_update_(params, local_grads, state, lr, grad_norm, decays, config)
        return (grad_norm, applied, metrics, *losses)

    # Fixed signatures (make_fx traces positional arguments, not defaults).
    def step(params, exp_avg, exp_avg_sq, step_count, lr, tokens_ABS, labels_ABS):
        def micro_batch_loss(index):
            return loss_and_metrics(model, tokens_ABS[index], labels_ABS[index])

        return run(params, exp_avg, exp_avg_sq, step_count, lr, tokens_ABS.shape[0], micro_batch_loss)

    def step_in_documents(params, exp_avg, exp_avg_sq, step_count, lr, tokens_ABS, labels_ABS, document_ids_ABS):
        def micro_batch_loss(index):
            return loss_and_metrics(
                model, tokens_ABS[index], labels_ABS[index], document_ids_BS=document_ids_ABS[index]
            )

        return run(params, exp_avg, exp_avg_sq, step_count, lr, tokens_ABS.shape[0], micro_batch_loss)

    def step_on_named(params, exp_avg, exp_avg_sq, step_count, lr, named_A):
        def micro_batch_loss(index):
            return loss_and_metrics(model, **{name: value[index] for name, value in named_A.items()})

        micro_batches = next(iter(named_A.values())).shape[0]
        return run(params, exp_avg, exp_avg_sq, step_count, lr, micro_batches, micro_batch_loss)

    if named:
        return step_on_named
    return step_in_documents if document_ids else step


def _local_grad(grad: torch.Tensor, spec: ParamSpec) -> torch.Tensor:
    if spec.dtensor is None:
        return grad
    assert isinstance(grad, DTensor)
    if tuple(grad.placements) != tuple(spec.dtensor.placements):
        grad = grad.redistribute(placements=spec.dtensor.placements)
    return grad.to_local()


def capture_step(
    model: nn.Module,
    specs: Sequence[ParamSpec],
    config: TrainConfig,
    device_type: str,
    example_inputs: tuple,
    update: bool = True,
) -> fx.GraphModule:
    """Trace the whole step into one ``GraphModule`` (fake tensors: nothing runs, nothing is allocated).

    Each node keeps the module path it came from (``nn_module_stack``), which the memory
    policies use to find transformer-block boundaries. ``example_inputs`` are the step's
    arguments (see ``step_function``); an eighth, the document ids, selects the step with them, and a
    dict of named tensors in sixth place the step on named batches. The graph's ``meta["block_paths"]`` lists
    the model's transformer blocks (``titanpod.graph.blocks``), which the memory policies read. Without
    ``update`` the graph stops before AdamW (``step_function``).
    """
    named = isinstance(example_inputs[-1], Mapping)
    function = step_function(
        model,
        specs,
        config,
        device_type,
        document_ids=len(example_inputs) == 8 and not named,
        named=named,
        update=update,
    )
    function._orig_mod = model  # type: ignore[attr-defined]  # make_fx records module paths under this root
    graph = make_fx(function, tracing_mode="fake", record_module_stack=True)(*example_inputs)
    graph.meta[BLOCK_PATHS] = [path for path, _ in transformer_blocks(model)]
    return graph


def step_outputs(graph: fx.Graph) -> Any:
    """The output nodes of a captured step in the step's own structure: ``(grad_norm, applied, metrics, *losses)``.

    ``make_fx`` stores outputs flattened (a metrics dict contributes one node per entry, an
    empty one none) beside the structure that rebuilds them, which is applied here.
    """
    flat = graph.output_node().args[0]
    info = getattr(graph._codegen, "pytree_info", None)
    if info is None or info.out_spec is None:
        return flat
    return pytree.tree_unflatten(list(flat), info.out_spec)  # type: ignore[arg-type]


def loss_outputs(graph: fx.Graph) -> list[fx.Node]:
    """The per-micro-batch loss nodes of a captured step (their ``detach`` stripped)."""
    losses = []
    for node in step_outputs(graph)[LEADING_OUTPUTS:]:
        while isinstance(node, fx.Node) and node.target == torch.ops.aten.detach.default:
            node = node.args[0]
        losses.append(node)
    return losses
