"""The training step in each mode: eager, per-block compiled, whole-step captured.

Legend: A micro-batches per step, B batch, S sequence.

A batch is ``(tokens_BS, labels_BS)`` or, for packed sequences with document masking,
``(tokens_BS, labels_BS, document_ids_BS)``; the ids reach ``model.loss`` as
``document_ids_BS`` only when given, so a 2-tuple step runs exactly as it did before.

Every mode runs the same arithmetic (the model's loss, the gradient norm, the functional
AdamW of ``titanpod.graph.optimizer``), so their losses and parameters agree to rounding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.distributed.tensor import DTensor

from titanpod.device import Backend
from titanpod.graph.capture import ParamSpec, autocast_context, capture_step
from titanpod.graph.config import TrainConfig
from titanpod.graph.loss_metrics import add_metrics, loss_and_metrics
from titanpod.graph.memory_policy import apply_memory_policy
from titanpod.graph.optimizer import (
    AdamWState,
    adamw_update_,
    init_adamw_state,
    local_tensor,
    total_grad_norm,
    weight_decays,
)

Batch = tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor] | Mapping[str, torch.Tensor]
"""``(tokens_BS, labels_BS)``, each [B, S] token ids, or ``(tokens_BS, labels_BS, document_ids_BS)``:
the third, [B, S] integers equal within a document and increasing along the row, keeps each
token's attention within its own packed document (``Transformer.loss(..., document_ids_BS)``).
Any other model takes its batch as named tensors: a mapping, passed as ``model.loss(**batch)``
(eager and per-block steps)."""


def batch_loss_and_metrics(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``model.loss`` of one batch: ``loss(tokens, labels)``, plus ``document_ids_BS=`` for a 3-tuple;
    ``loss(**batch)`` for a mapping of named tensors; with the figures the model reports beside it
    (``titanpod.graph.loss_metrics``)."""
    if isinstance(batch, Mapping):
        return loss_and_metrics(model, **batch)
    if len(batch) == 2:
        return loss_and_metrics(model, batch[0], batch[1])
    if len(batch) == 3:
        return loss_and_metrics(model, batch[0], batch[1], document_ids_BS=batch[2])
    raise ValueError(
        f"A batch is (tokens, labels) or (tokens, labels, document_ids), got a {type(batch).__name__} of {len(batch)}."
    )


def stack_micro_batches(micro_batches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Tokens, labels and (when the batches carry them) document ids, each stacked to [A, B, S].

    Every micro-batch of a step must have the same form: all 2-tuples or all 3-tuples.
    """
    if any(isinstance(batch, Mapping) for batch in micro_batches):
        raise NotImplementedError(
            "Batches of named tensors (a diffusion model's) run in the eager and per_block step modes; "
            "set train.step_mode to eager or per_block."
        )
    lengths = sorted({len(batch) for batch in micro_batches})
    if len(lengths) != 1 or lengths[0] not in (2, 3):
        raise ValueError(
            "The micro-batches of one step must all be (tokens, labels) or all (tokens, labels, document_ids); "
            f"got tuples of lengths {lengths}."
        )
    tokens_ABS = torch.stack([batch[0] for batch in micro_batches])
    labels_ABS = torch.stack([batch[1] for batch in micro_batches])
    ids_ABS = torch.stack([batch[2] for batch in micro_batches]) if lengths[0] == 3 else None  # type: ignore[misc]
    return tokens_ABS, labels_ABS, ids_ABS


@dataclass
class StepOutput:
    """What one step reports, left on the device until the loop reads it."""

    loss: Any
    """Mean loss over the step's micro-batches (this process's data): a 0-d tensor (or jax array on xla)."""
    grad_norm: Any
    """Global gradient norm before clipping, 0-d."""
    applied: Any
    """False when the gradient norm was not finite and the update was skipped, 0-d bool."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Figures the model reports beside its loss (an MoE model's ``dropped_tokens``), each summed over
    the step's micro-batches (this process's data), 0-d on the device; empty for models that report none."""


class TrainStep(ABC):
    """One optimizer step over a list of micro-batches; owns the optimizer state."""

    def __init__(self, model: nn.Module, config: TrainConfig, backend: Backend) -> None:
        self.model = model
        self.config = config
        self.backend = backend
        self.params = [p for p in model.parameters() if p.requires_grad]
        if len(self.params) != len(list(model.parameters())):
            raise ValueError("Every parameter must be trainable: frozen parameters are not supported by the loop yet.")
        self.decays = weight_decays(self.params, config)
        self.state: AdamWState = self.initial_state()

    def initial_state(self) -> AdamWState:
        """Zero AdamW moments beside the parameters (the xla step keeps them on its JAX devices instead)."""
        return init_adamw_state(self.params)

    def lr_tensor(self, lr: float) -> torch.Tensor:
        """The learning rate as a 0-d tensor on the step's device."""
        return torch.tensor(lr, dtype=torch.float32, device=self.state.step.device)

    @abstractmethod
    def __call__(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        """Forward and backward over ``micro_batches`` (on the device), then one AdamW update."""

    def finish(self) -> None:  # noqa: B027 - optional: torch steps update the model in place
        """Make the model's parameters hold the trained values (steps that keep them elsewhere copy back)."""


class EagerStep(TrainStep):
    """Op-by-op forward and backward; with ``compile_blocks``, each transformer block is compiled."""

    def __init__(self, model: nn.Module, config: TrainConfig, backend: Backend, compile_blocks: bool = False) -> None:
        super().__init__(model, config, backend)
        if compile_blocks and config.compiler == "auto":
            blocks = getattr(model, "layers", None)
            if blocks is None:
                raise ValueError(f"step_mode='per_block' needs a model with .layers; {type(model).__name__} has none.")
            if backend.compile_backend is None:
                raise ValueError(f"step_mode='per_block' cannot compile on the {backend.lane} lane; use whole_step.")
            for block in blocks:
                block.compile(backend=backend.compile_backend, dynamic=False)

    def __call__(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        losses, metrics = [], None
        for batch in micro_batches:
            with autocast_context(self.config, self.backend.device_type):
                loss, batch_metrics = batch_loss_and_metrics(self.model, batch)
            (loss / len(micro_batches)).backward()
            losses.append(loss.detach())
            metrics = add_metrics(metrics, batch_metrics)
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            missing = [n for n, p in self.model.named_parameters() if p.grad is None]
            raise RuntimeError(f"No gradient reached {', '.join(missing[:5])}: is it used by the loss?")
        with torch.no_grad():
            grad_norm = total_grad_norm(grads)  # type: ignore[arg-type]
            applied = adamw_update_(
                [local_tensor(p) for p in self.params],
                [local_tensor(g) for g in grads],  # type: ignore[arg-type]
                self.state,
                self.lr_tensor(lr),
                grad_norm,
                self.decays,
                self.config,
            )
        for param in self.params:
            param.grad = None
        return StepOutput(torch.stack(losses).mean(), grad_norm, applied, metrics or {})


class WholeStep(TrainStep):
    """The whole step as one captured graph, rewritten by the memory policy and compiled once.

    The graph is captured on the first call (it needs the batch shape) and reused while
    the shape stays; a new shape, or batches that start or stop carrying document ids,
    captures again. Document ids are one more graph input, [A, B, S] like the tokens.
    """

    def __init__(self, model: nn.Module, config: TrainConfig, backend: Backend) -> None:
        super().__init__(model, config, backend)
        self.specs = [
            ParamSpec(p if isinstance(p, DTensor) else None, decay)
            for p, decay in zip(self.params, self.decays, strict=True)
        ]
        self.local_params = [local_tensor(p.detach()) for p in self.params]
        self.graph: fx.GraphModule | None = None
        self._program = None
        self._shape: tuple[Any, ...] | None = None

    def _inputs(
        self,
        tokens_ABS: torch.Tensor,
        labels_ABS: torch.Tensor,
        lr: torch.Tensor,
        document_ids_ABS: torch.Tensor | None = None,
    ) -> tuple:
        state = self.state
        inputs = (self.local_params, state.exp_avg, state.exp_avg_sq, state.step, lr, tokens_ABS, labels_ABS)
        return inputs if document_ids_ABS is None else (*inputs, document_ids_ABS)

    def prepare(
        self, tokens_ABS: torch.Tensor, labels_ABS: torch.Tensor, document_ids_ABS: torch.Tensor | None = None
    ) -> fx.GraphModule:
        """Capture, rewrite and compile the step for batches of this shape (done by the first call).

        With ``document_ids_ABS`` [A, B, S] the captured step takes them as its last input.
        """
        inputs = self._inputs(tokens_ABS, labels_ABS, self.lr_tensor(0.0), document_ids_ABS)
        graph = capture_step(self.model, self.specs, self.config, self.backend.device_type, inputs)
        apply_memory_policy(graph, self.config.memory_policy, self.backend.device_type)
        self.graph = graph
        if self.config.compiler == "auto":
            if self.backend.compile_backend is None:
                raise ValueError(f"The {self.backend.lane} lane compiles with jax.jit; use the xla step for it.")
            self._program = torch.compile(graph, backend=self.backend.compile_backend, fullgraph=True, dynamic=False)
        else:
            self._program = graph
        self._shape = _shape_key(tokens_ABS, document_ids_ABS)
        return graph

    def __call__(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        tokens_ABS, labels_ABS, ids_ABS = stack_micro_batches(micro_batches)
        if self._program is None or self._shape != _shape_key(tokens_ABS, ids_ABS):
            self.prepare(tokens_ABS, labels_ABS, ids_ABS)
        assert self._program is not None
        inputs = self._inputs(tokens_ABS, labels_ABS, self.lr_tensor(lr), ids_ABS)
        grad_norm, applied, metrics, *losses = self._program(*inputs)
        return StepOutput(torch.stack(losses).mean(), grad_norm, applied, metrics)


def _shape_key(tokens_ABS: torch.Tensor, document_ids_ABS: torch.Tensor | None) -> tuple[Any, ...]:
    """What a captured step is specialised to: the batch shape, and the ids' shape and dtype if any."""
    if document_ids_ABS is None:
        return (tuple(tokens_ABS.shape),)
    return (tuple(tokens_ABS.shape), tuple(document_ids_ABS.shape), document_ids_ABS.dtype)


def build_step(
    model: nn.Module, config: TrainConfig, backend: Backend, *, plan: Any = None, axes: dict[str, int] | None = None
) -> TrainStep:
    """The step for ``config.step_mode`` on ``backend``'s lane.

    On the xla lane every mode runs as the whole step under ``jax.jit`` (``XlaStep``),
    sharded by ``plan`` (a ``titanpod.parallel.ShardingPlan``) over the mesh axes ``axes``;
    without them it is replicated on one device. Other lanes ignore ``plan`` and ``axes``.
    """
    if backend.lane == "xla":
        from titanpod.graph.xla_step import XlaStep

        return XlaStep(model, config, backend, plan=plan, axes=axes)
    if config.step_mode == "whole_step":
        return WholeStep(model, config, backend)
    return EagerStep(model, config, backend, compile_blocks=config.step_mode == "per_block")
