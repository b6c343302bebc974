"""The training step in each mode: eager, per-block compiled, whole-step captured; ``build_step`` picks one.

Legend: A micro-batches per step, B batch, S sequence.

Batches, what a step reports and the ``TrainStep`` base are in ``titanpod.graph.step_base``.
Every mode runs the same arithmetic (the model's loss, the gradient norm, the functional
AdamW of ``titanpod.graph.optimizer``), so their losses and parameters agree to rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import fx, nn
from torch.distributed.tensor import DTensor

from titanpod.device import Backend
from titanpod.device.host_memory import keep_freed_host_memory
from titanpod.graph.blocks import transformer_blocks
from titanpod.graph.capture import ParamSpec, autocast_context, capture_step, step_function
from titanpod.graph.config import TrainConfig
from titanpod.graph.constant_folding import fold_constants
from titanpod.graph.loss_metrics import add_metrics
from titanpod.graph.memory_policy import apply_memory_policy
from titanpod.graph.optimizer import local_tensor, total_grad_norm
from titanpod.graph.step_base import (
    Batch,
    StepOutput,
    TrainStep,
    batch_loss_and_metrics,
    stack_micro_batches,
    stack_named_batches,
)
from titanpod.graph.step_compiler import StepSource
from titanpod.graph.step_compiler_choice import choose_step_compiler


class EagerStep(TrainStep):
    """Op-by-op forward and backward; with ``compile_blocks``, each transformer block is compiled."""

    def __init__(self, model: nn.Module, config: TrainConfig, backend: Backend, compile_blocks: bool = False) -> None:
        super().__init__(model, config, backend)
        if compile_blocks and config.compiler == "auto":
            blocks = transformer_blocks(model)
            if not blocks:
                raise ValueError(
                    f"step_mode='per_block' compiles each transformer block, and {type(model).__name__} has none "
                    "(no .layers, nor lists named in a block_lists attribute); use eager or whole_step."
                )
            if backend.compile_backend is None:
                raise ValueError(f"step_mode='per_block' cannot compile on the {backend.lane} lane; use whole_step.")
            for _, block in blocks:
                block.compile(backend=backend.compile_backend, dynamic=False)

    def __call__(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        losses, metrics = [], None
        for batch in micro_batches:
            with autocast_context(self.config, self.backend.device_type):
                loss, batch_metrics = batch_loss_and_metrics(self.model, batch)
            (loss / len(micro_batches)).backward()
            losses.append(loss.detach())
            metrics = add_metrics(metrics, batch_metrics)
        grads = self.gradients()
        with torch.no_grad():
            grad_norm = total_grad_norm(grads)
        applied = self.update_(grads, grad_norm, lr)
        for param in self.params:
            param.grad = None
        self.backend.end_step()
        return StepOutput(torch.stack(losses).mean(), grad_norm, applied, metrics or {})


Example = tuple[torch.Tensor, ...] | tuple[dict[str, torch.Tensor]]
"""A batch a whole step is captured for: tokens and labels [A, B, S] (and document ids [A, B, S] when the
batches carry them), or one dict of named tensors, each stacked over the micro-batches."""


class WholeStep(TrainStep):
    """The whole step as one captured graph, rewritten by the memory policy and compiled once.

    The graph is captured on the first call (it needs the batch shape) and reused while
    the shape stays; a new shape, or batches that start or stop carrying document ids,
    captures again. Document ids are one more graph input, [A, B, S] like the tokens.
    Batches of named tensors (a diffusion objective's) are one dict input, each tensor
    stacked over the micro-batches; a new name, shape or dtype captures again.

    The step compiler (``titanpod.graph.step_compiler``, ``train.step_compiler``) turns the graph into a
    program. One that keeps compiled steps (``cached``) is first asked for a step a run before this one
    compiled, which it loads without a capture; ``graph`` is then captured only if read.
    """

    def __init__(self, model: nn.Module, config: TrainConfig, backend: Backend) -> None:
        super().__init__(model, config, backend)
        self.specs = [
            ParamSpec(p if isinstance(p, DTensor) else None, decay)
            for p, decay in zip(self.params, self.decays, strict=True)
        ]
        self._graph: fx.GraphModule | None = None
        self._example: Example | None = None
        self._program = None
        self._shape: tuple[Any, ...] | None = None
        self.update_after_program = update_after_program(config, backend)
        """Whether AdamW runs after the compiled program (which then returns the gradients), not inside it."""
        builders = (capture_step, fold_constants, apply_memory_policy, step_function)
        source = StepSource(model, config, backend.device_type, self.decays, builders)
        self._compiler = choose_step_compiler(config, backend, source)  # made now: it may start work to overlap

    @property
    def local_params(self) -> list[torch.Tensor]:
        """The parameters' local parts as the program takes them, made afresh each call: an update that gives a
        parameter a new buffer (``AdamWProgram``) leaves an earlier ``detach()`` of it on the old one."""
        return [local_tensor(p.detach()) for p in self.params]

    @property
    def graph(self) -> fx.GraphModule | None:
        """The captured step for the last batch shape (``None`` before the first call); captured on first read
        when the compiled step was loaded without it."""
        if self._graph is None and self._example is not None:
            self._graph = self._capture(self._batch_inputs(self._example, self.lr_tensor(0.0)))
        return self._graph

    def _inputs(
        self,
        tokens_ABS: torch.Tensor,
        labels_ABS: torch.Tensor,
        lr: torch.Tensor,
        document_ids_ABS: torch.Tensor | None = None,
    ) -> tuple:
        example = (tokens_ABS, labels_ABS) if document_ids_ABS is None else (tokens_ABS, labels_ABS, document_ids_ABS)
        return self._batch_inputs(example, lr)

    def _batch_inputs(self, example: Example, lr: torch.Tensor) -> tuple:
        state = self.state
        return (self.local_params, state.exp_avg, state.exp_avg_sq, state.step, lr, *example)

    def _capture(self, inputs: tuple) -> fx.GraphModule:
        graph = capture_step(
            self.model, self.specs, self.config, self.backend.device_type, inputs, update=not self.update_after_program
        )
        fold_constants(graph)
        apply_memory_policy(graph, self.config.memory_policy, self.backend.device_type)
        return graph

    def prepare(
        self, tokens_ABS: torch.Tensor, labels_ABS: torch.Tensor, document_ids_ABS: torch.Tensor | None = None
    ) -> fx.GraphModule:
        """Capture, rewrite and compile the step for batches of this shape (done by the first call).

        With ``document_ids_ABS`` [A, B, S] the captured step takes them as its last input.
        """
        example = (tokens_ABS, labels_ABS) if document_ids_ABS is None else (tokens_ABS, labels_ABS, document_ids_ABS)
        return self._prepare(example, self._batch_inputs(example, self.lr_tensor(0.0)))

    def _prepare(self, example: Example, inputs: tuple) -> fx.GraphModule:
        """Capture the step and compile it."""
        graph = self._capture(inputs)
        self._graph, self._example = graph, example
        if self._compiler is None:
            self._program = graph
        else:
            self._program, self.compile_report = self._compiler.compile(graph, inputs)
        self._shape = _shape_key(example)
        return graph

    def _load(self, example: Example, inputs: tuple) -> bool:
        """Load the compiled step a run before this one kept, without capturing; False if there is none."""
        loaded = self._compiler.load(inputs) if self._compiler is not None else None
        if loaded is None:
            return False
        self._program, self.compile_report = loaded
        self._graph, self._example = None, example
        self._shape = _shape_key(example)
        return True

    def __call__(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        if any(isinstance(batch, Mapping) for batch in micro_batches):
            example: Example = (stack_named_batches(micro_batches),)
        else:
            example = tuple(t for t in stack_micro_batches(micro_batches) if t is not None)
        if self._program is None or self._shape != _shape_key(example):
            inputs = self._batch_inputs(example, self.lr_tensor(0.0))
            if not self._load(example, inputs):
                self._prepare(example, inputs)
        assert self._program is not None
        grad_norm, applied, metrics, *losses = self._program(*self._batch_inputs(example, self.lr_tensor(lr)))
        if self.update_after_program:  # the program returned the local gradients where it returns the flag
            applied = self.update_(applied, grad_norm, lr)
        self.backend.end_step()
        return StepOutput(torch.stack(losses).mean(), grad_norm, applied, metrics)


def update_after_program(config: TrainConfig, backend: Backend) -> bool:
    """Whether a whole step leaves AdamW to run after its compiled program (``TrainConfig.whole_step_update``):
    asked for, or ``auto`` on a lane whose compile cannot write the update into its inputs' buffers."""
    if config.whole_step_update == "auto":
        return not backend.compiled_step_donates_inputs
    return config.whole_step_update == "after_program"


def _shape_key(example: Example) -> tuple[Any, ...]:
    """What a captured step is specialised to: the batch tensors' shapes (and the document ids' dtype), or each
    named tensor's name, shape and dtype."""
    if isinstance(example[0], Mapping):
        return tuple((name, tuple(value.shape), value.dtype) for name, value in example[0].items())
    tokens_ABS = example[0]
    if len(example) == 2:
        return (tuple(tokens_ABS.shape),)
    return (tuple(tokens_ABS.shape), tuple(example[2].shape), example[2].dtype)


def build_step(
    model: nn.Module,
    config: TrainConfig,
    backend: Backend,
    *,
    plan: Any = None,
    axes: dict[str, int] | None = None,
    initial_values: Callable[[str, tuple[slice, ...]], torch.Tensor] | None = None,
    pipeline: Any = None,
    gather_dtype: torch.dtype | None = None,
) -> TrainStep:
    """The step for ``config.step_mode`` on ``backend``'s lane.

    On a single-controller backend (the xla lane: one process drives every device) every mode
    runs as the whole step under ``jax.jit`` (``titanpod.graph.xla.XlaStep``), sharded by ``plan``
    (a ``titanpod.parallel.ShardingPlan``) over the mesh axes ``axes``; without them it is
    replicated on one device. There the model may be left on the meta device, its parameters
    created sharded on the devices from ``initial_values(name, region)``. Other lanes ignore
    ``plan``, ``axes`` and ``initial_values`` (their model is materialised already).
    ``pipeline`` (a ``titanpod.parallel.torch_executor.PipelineModel``, parallel.pp > 1) gives the
    ``PipelineStep`` over its stages (eager step mode only); ``model`` is then ``pipeline.model``.
    ``gather_dtype``: the xla step gathers sharded parameters in this dtype (FSDP's ``param_dtype``).
    """
    if config.keep_host_memory and backend.device_type == "cpu":
        keep_freed_host_memory()
    if pipeline is not None:
        from titanpod.graph.pipeline_step import PipelineStep  # imported here: only pipelines need it

        return PipelineStep(pipeline, config, backend)
    if backend.single_controller:
        from titanpod.graph.xla.step import XlaStep  # imported here: only that lane needs it

        return XlaStep(
            model, config, backend, plan=plan, axes=axes, initial_values=initial_values, gather_dtype=gather_dtype
        )
    if config.step_mode == "whole_step":
        return WholeStep(model, config, backend)
    return EagerStep(model, config, backend, compile_blocks=config.step_mode == "per_block")
