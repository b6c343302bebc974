"""What every training step shares: the batch forms, what a step reports, and the ``TrainStep`` base.

Legend: A micro-batches per step, B batch, S sequence.

A batch is ``(tokens_BS, labels_BS)`` or, for packed sequences with document masking,
``(tokens_BS, labels_BS, document_ids_BS)``; the ids reach ``model.loss`` as
``document_ids_BS`` only when given, so a 2-tuple step runs exactly as it did before.

The torch lanes' steps (``titanpod.graph.steps``) and the xla lane's (``titanpod.graph.xla``)
both build on this module and on nothing of each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from titanpod.device import Backend
from titanpod.graph.adamw_program import AdamWProgram
from titanpod.graph.config import TrainConfig
from titanpod.graph.loss_metrics import loss_and_metrics
from titanpod.graph.optimizer import AdamWState, adamw_update_, init_adamw_state, local_tensor, weight_decays
from titanpod.graph.step_compiler import CompileReport
from titanpod.graph.step_state import load_optimizer_state_, optimizer_state_dict

Batch = tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor] | Mapping[str, torch.Tensor]
"""``(tokens_BS, labels_BS)``, each [B, S] token ids, or ``(tokens_BS, labels_BS, document_ids_BS)``:
the third, [B, S] integers equal within a document and increasing along the row, keeps each
token's attention within its own packed document (``Transformer.loss(..., document_ids_BS)``).
Any other model takes its batch as named tensors: a mapping, passed as ``model.loss(**batch)``
(eager and per-block steps)."""

StateFormat = Literal["torch", "jax"]
"""How a step's ``state_dict()`` is saved: ``torch`` (torch.distributed.checkpoint, beside the model's
parameters) or ``jax`` (Orbax: the step holds parameters and optimizer state as jax arrays)."""


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
        raise ValueError(
            "These micro-batches are named tensors (a diffusion objective's); stack them with stack_named_batches."
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


def stack_named_batches(micro_batches: list[Batch]) -> dict[str, torch.Tensor]:
    """Micro-batches of named tensors as one dict, each tensor stacked over the micro-batches in a new first
    dimension [A, ...]. Every micro-batch must name the same tensors, with the same shapes."""
    if not all(isinstance(batch, Mapping) for batch in micro_batches):
        raise ValueError("The micro-batches of one step must all be named tensors, or all (tokens, labels) tuples.")
    named: list[Mapping[str, torch.Tensor]] = micro_batches  # type: ignore[assignment]
    names = list(named[0])
    for batch in named[1:]:
        if sorted(batch) != sorted(names):
            raise ValueError(
                f"The micro-batches of one step name different tensors: {sorted(names)} and {sorted(batch)}."
            )
    return {name: torch.stack([batch[name] for batch in named]) for name in names}


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

    state_format: ClassVar[StateFormat] = "torch"
    """How ``state_dict()`` is saved. ``torch``: it is the optimizer state alone, torch tensors (moments
    laid out like their parameters), saved with torch.distributed.checkpoint beside the model's own
    parameters, which the step updates in place. ``jax``: it is the parameters and the optimizer state
    as jax arrays (the trainer-state layout, ``{"model": ..., "optim": ...}``), saved with Orbax."""

    compile_report: CompileReport | None = None
    """How the step's whole program was last compiled (by inductor, or by XLA on the xla lane): time, cache hit
    or miss; ``None`` for steps that compile no whole program."""

    def __init__(self, model: nn.Module, config: TrainConfig, backend: Backend) -> None:
        self.model = model
        self.config = config
        self.backend = backend
        named = list(model.named_parameters())
        if any(not p.requires_grad for _, p in named):
            raise ValueError("Every parameter must be trainable: frozen parameters are not supported by the loop yet.")
        self.names = [name for name, _ in named]
        """The model's parameter names, in the order of ``params`` and of the optimizer state's lists."""
        self.params = [p for _, p in named]
        self.decays = weight_decays(self.params, config)
        self.state: AdamWState = self.initial_state()
        self._update_program: AdamWProgram | None = None

    def initial_state(self) -> AdamWState:
        """Zero AdamW moments beside the parameters (the xla step keeps them on its JAX devices instead)."""
        return init_adamw_state(self.params)

    def lr_tensor(self, lr: float) -> torch.Tensor:
        """The learning rate as a 0-d tensor on the step's device (a factory op, which fake tensor
        modes see; ``torch.tensor`` would copy host data to the device even while tracing)."""
        return torch.full((), lr, dtype=torch.float32, device=self.state.step.device)

    def state_dict(self) -> dict[str, Any]:
        """The state this step holds, in the layout ``state_format`` names; here the optimizer state
        ``{"step": 0-d, "exp_avg": {name: m}, "exp_avg_sq": {name: v}}``, moments laid out like their
        parameters (DTensors when those are sharded).

        The tensors are the step's own, not copies: the next step changes them, so save (or clone)
        them before stepping again; loading into them in place loads the step.
        """
        return optimizer_state_dict(self.names, self.params, self.state)

    def state_like(self) -> dict[str, Any]:
        """What a restore reads a checkpoint of ``state_dict()``'s layout into and checks it against: here
        ``state_dict()`` itself. A step whose ``state_dict()`` copies gives its arrays' shapes, dtypes and shardings
        instead (the xla step: ``jax.ShapeDtypeStruct``s)."""
        return self.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Copy ``state`` (the layout of ``state_dict()``) into the step; a missing, unexpected or
        mis-shaped entry raises ``ValueError`` naming it. ``state`` is not kept: it may change afterwards."""
        load_optimizer_state_(self.state, self.names, self.params, state)

    def gradients(self) -> list[torch.Tensor]:
        """The parameters' gradients after the backward; ``RuntimeError`` naming parameters none reached."""
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            missing = [n for n, p in self.model.named_parameters() if p.grad is None]
            raise RuntimeError(f"No gradient reached {', '.join(missing[:5])}: is it used by the loss?")
        return grads  # type: ignore[return-value]

    def update_(self, grads: list[torch.Tensor], grad_norm: torch.Tensor, lr: float) -> torch.Tensor:
        """One AdamW update of the parameters' local shards from ``grads`` clipped by ``grad_norm`` (skipped
        where it is not finite); returns whether it was applied (0-d bool)."""
        if self.backend.update_as_one_program and not any(isinstance(p, DTensor) for p in self.params):
            if self._update_program is None:
                self._update_program = AdamWProgram(self.config, self.decays)
            with torch.no_grad():
                return self._update_program(self.params, grads, self.state, self.lr_tensor(lr), grad_norm)
        with torch.no_grad():
            return adamw_update_(
                [local_tensor(p) for p in self.params],
                [local_tensor(g) for g in grads],
                self.state,
                self.lr_tensor(lr),
                grad_norm,
                self.decays,
                self.config,
            )

    @abstractmethod
    def __call__(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        """Forward and backward over ``micro_batches`` (on the device), then one AdamW update."""

    evaluates_held_out: ClassVar[bool] = False
    """Whether ``held_out_loss`` computes on the step's own copy of the parameters (where the step keeps them off
    the model: the xla lane's devices). ``False``: the model itself holds the trained values; run it."""

    def held_out_loss(self, batch: Batch) -> Any:
        """The model's cross-entropy (the auxiliary MoE loss left out) on one held-out ``batch``, 0-d, computed
        where the step keeps the parameters, without changing them; only where ``evaluates_held_out``."""
        raise NotImplementedError(f"{type(self).__name__} trains the model in place: run the model itself.")

    def finish(self) -> None:  # noqa: B027 - optional: torch steps update the model in place
        """Make the model's parameters hold the trained values (steps that keep them elsewhere copy back)."""
