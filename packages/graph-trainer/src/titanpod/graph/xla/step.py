"""The xla lane's training step: the whole step as one ``jax.jit`` program, through torchax.

Legend: A micro-batches per step, B batch, S sequence.

The model's torch ``loss`` runs as a JAX function (``torchax.interop.jax_view`` of a
``torch.func.functional_call``); ``jax.value_and_grad`` differentiates it, a ``lax.scan``
sums the gradients of the A micro-batches, and the optimizer is the torch lanes' own
functional AdamW (``adamw_update_``), also run through ``jax_view``, so every lane does
the same arithmetic. Parameters and AdamW moments live on the JAX devices as arrays
sharded by the plan (``titanpod.parallel.xla_executor``); XLA's SPMD partitioner adds
the gathers and gradient reductions. Parameters and state are donated to the program,
so a step updates them in place. jax and torchax are imported only when a step is built.
Batches may carry document ids (3-tuples, see ``titanpod.graph.step_base.Batch``): they are one
more [A, B, S] input, sharded like the tokens, scanned with them and passed to ``model.loss``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from titanpod.device import Backend
from titanpod.graph.blocks import transformer_blocks
from titanpod.graph.config import TrainConfig
from titanpod.graph.device_full import is_out_of_memory, out_of_device_memory
from titanpod.graph.optimizer import AdamWState
from titanpod.graph.step_base import Batch, StepOutput
from titanpod.graph.xla.batches import named_batch_sharding, place_micro_batches
from titanpod.graph.xla.compile_cache import compile_lowered, use_xla_cache, xla_cache_dir
from titanpod.graph.xla.fit import check_state_fits
from titanpod.graph.xla.gather import fsdp_gather, hidden_states_layout, self_gathered
from titanpod.graph.xla.held_out import held_out_program
from titanpod.graph.xla.layer_stack import LayerStack
from titanpod.graph.xla.loss import jax_loss
from titanpod.graph.xla.mesh import batch_sharding, default_mesh, replicated
from titanpod.graph.xla.program_figures import ProgramFigures, program_figures
from titanpod.graph.xla.remat import BlockGather, remat_policy
from titanpod.graph.xla.state import RegionValues, place_params, zero_adamw_state, zero_adamw_state_in_pieces
from titanpod.graph.xla.state_step import JaxStateStep
from titanpod.graph.xla.step_program import in_host_memory, jax_adamw_update, jax_step, jit_step

__all__ = ["XlaStep", "block_list_counts", "self_gathered"]


class XlaStep(JaxStateStep):
    """One optimizer step as a single ``jax.jit`` program: forward, backward, gradient sum, clipping, AdamW.

    ``plan`` (a ``titanpod.parallel.ShardingPlan``) and ``axes`` (mesh axis -> size) shard
    parameters, moments and batches over ``mesh`` (built from ``axes`` when not given);
    with no plan every array is replicated on a one-device mesh. The program is compiled
    on the first call and again only when the batch shape changes, through JAX's persistent
    compilation cache in ``train.compile_cache_dir`` (``titanpod.graph.xla.compile_cache``);
    ``compile_report`` says how long the last compile took and whether it came from that cache. The torch model's
    parameters are not updated while training: ``finish()`` copies the trained values back.
    ``state`` holds the AdamW moments and step count as jax arrays, sharded like the parameters.

    A model left on the meta device is never made whole on the host to start: each device's shard of
    each parameter is created from ``initial_values(name, region)`` (e.g.
    ``titanpod.models.region_initializer(model, seed)``); ``finish()`` then materialises the torch model.

    With ``config.scan_layers`` the blocks run as one ``lax.scan`` (``titanpod.graph.xla.scan``) and the step
    holds their parameters and moments stacked (``layer_stack``: ``jax_params`` and ``state`` are per entry);
    ``state_dict()``, ``load_state_dict`` and ``finish()`` speak of the model's own per-layer parameters.
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        backend: Backend,
        plan: Any = None,
        axes: Mapping[str, int] | None = None,
        mesh: Any = None,
        initial_values: RegionValues | None = None,
        gather_dtype: torch.dtype | None = None,
    ) -> None:
        self.axes = dict(axes or {})
        self.gather_dtype = gather_dtype
        """The dtype parameters are gathered in for a block's use (FSDP's ``param_dtype``): cast before the
        gather, so the gather moves those bytes; ``None`` gathers them as stored (fp32)."""
        self.policy = remat_policy(config.memory_policy)
        self._plan, self._mesh, self._initial_values = plan, mesh, initial_values
        # Before the first compile of this step, which places the parameters.
        self._cache_folder = use_xla_cache(xla_cache_dir(config.compile_cache_dir))
        self._compiled: dict[tuple, Any] = {}  # batch arrays' (shape, dtype)s -> the program compiled for them
        self._evaluation: Any = None  # the jitted held-out loss, made on first use
        named = list(model.named_parameters())
        self.layer_stack = (
            LayerStack.of([n for n, _ in named], [tuple(p.shape) for _, p in named], block_list_counts(model))
            if config.scan_layers
            else LayerStack.flat([n for n, _ in named])
        )
        self.moments_in_host_memory = config.optimizer_offload
        super().__init__(model, config, backend)  # calls initial_state: parameters and moments on the mesh
        self.program = self.jitted_step()
        """The ``jax.jit`` of the step: lowered and compiled once per batch shape (``_compiled_program``), never
        called itself, so that each compile is timed and its cache hit or miss reported."""

    def initial_state(self) -> AdamWState:
        """Place the parameters on the mesh (``jax_params``) and make zero moments sharded like them.

        With stacked blocks each block's parameters are placed as the plan says, then stacked once (for a
        moment the blocks' parameters are on the devices twice). Refuses (``DoesNotFitDevice``) before making
        the moments where they would not fit the device."""
        with self.backend.runtime():
            self.mesh = self._mesh if self._mesh is not None else default_mesh(self.backend, self.axes)
            named = list(zip(self.names, self.params, strict=True))
            placed = place_params(named, self._plan, self.mesh, self.axes, self._initial_values)
            self._initial_values = None  # used once: the step's own arrays hold the parameters from here on
            self.name_shardings = {name: array.sharding for name, array in zip(self.names, placed, strict=True)}
            self.param_shardings = self._entry_shardings()
            self.jax_params = self._stacked(placed) if self.layer_stack.stacks_any else placed
            del placed  # the per-block arrays, once stacked: freed before the moments are made
            self._set_moment_rows()
            if not self.config.optimizer_offload:  # moments kept in host memory take nothing from the device
                param_bytes = sum(_device_bytes(array) for array in self.jax_params)
                check_state_fits(param_bytes, self.backend.memory_stats())
                return zero_adamw_state(self.jax_params, self.mesh, self.moment_shardings)
            host = in_host_memory(self.param_shardings)
            return zero_adamw_state_in_pieces(self.jax_params, self.mesh, self.moment_rows, host)

    @property
    def moment_shardings(self) -> list[Any]:
        """Where AdamW's moments live: the parameters' shardings; with ``TrainConfig.optimizer_offload``, for each
        entry a list with one sharding in host memory per piece (``moment_rows``)."""
        if not self.config.optimizer_offload:
            return list(self.param_shardings)
        host = in_host_memory(self.param_shardings)
        return [[sharding] * len(rows) for sharding, rows in zip(host, self.moment_rows, strict=True)]

    def batch_sharding(self) -> Any:
        """The sharding of a step's tokens [A, B, S]: B split over the mesh's data axes."""
        return batch_sharding(self.mesh, self.axes)

    def loss_function(self, cross_entropy_only: bool = False, gradient_sums: bool = False) -> Callable[..., Any]:
        """The model's loss as a JAX function of (the step's arrays, a micro-batch), returning (loss, metrics)
        (``titanpod.graph.xla.loss``), under the step's precision, remat policy, FSDP gather and hidden-state
        layout. ``cross_entropy_only``: the model's cross-entropy alone, as validation reports it, with no metrics.
        ``gradient_sums``: a function of (arrays, running sums of gradients, micro-batch) whose blocks' loop adds
        into the sums (``titanpod.graph.xla.loss.jax_loss``).
        """
        gather_rule, layout_input = self.gather_rule(), self.hidden_layout()
        return jax_loss(
            self.model, self.config, self.layer_stack, self.policy, gather_rule, layout_input, cross_entropy_only,
            gradient_sums,
        )  # fmt: skip

    def gather_rule(self) -> BlockGather | None:
        """FSDP's gather as sharding constraints, to ``gather_dtype`` (``titanpod.graph.xla.gather.fsdp_gather``);
        ``None`` when nothing is sharded over a data axis."""
        ndims = {name: param.ndim for name, param in zip(self.names, self.params, strict=True)}
        return fsdp_gather(self.model, self._plan, self.mesh, self.axes, ndims, self.name_shardings, self.gather_dtype)

    def hidden_layout(self) -> Callable[[Any], Any] | None:
        """A block's hidden states [B, S, D] laid out as the batch is
        (``titanpod.graph.xla.gather.hidden_states_layout``); ``None`` on a mesh without data or ``cp`` axes."""
        return hidden_states_layout(self.mesh, self.axes)

    def update_function(self) -> Callable[..., Any]:
        """The optimizer as a JAX function: (params, grads, exp_avg, exp_avg_sq, step, lr) ->
        (params, exp_avg, exp_avg_sq, step, grad_norm, applied), running ``adamw_update_``."""
        return jax_adamw_update(self.names, self.decays, self.layer_stack, self.config)

    def step_function(self) -> Callable[..., Any]:
        """The whole step as a JAX function, what is jitted (``titanpod.graph.xla.step_program.jax_step``)."""
        rows = self.moment_rows if self.config.optimizer_offload else None
        in_flight = 2 if self.config.optimizer_offload_overlap else 1
        summing = self.loss_function(gradient_sums=True) if self.config.sum_gradients_in_loop else None
        stacked = [self.layer_stack.is_stacked(index) for index in range(len(self.layer_stack.entries))]
        return jax_step(
            self.loss_function(), self.update_function(), self.param_shardings, rows, in_flight, summing, stacked
        )

    def jitted_step(self) -> Any:
        """``jax.jit`` of ``step_function``; parameters and optimizer state are donated and keep their shardings."""
        return jit_step(self.step_function(), self.mesh, self.param_shardings, self.moment_shardings)

    evaluates_held_out: ClassVar[bool] = True
    """Held-out batches are evaluated on the step's devices, with the parameters where they train."""

    def held_out_loss(self, batch: Batch) -> Any:
        """The model's cross-entropy on one held-out ``batch``, 0-d, as a forward-only program on the step's mesh
        (compiled once per batch shape, Pallas kernels included), reading the step's parameters where they are:
        nothing is copied to the host and the parameters are not donated."""
        import jax

        if self._evaluation is None:
            self._evaluation = held_out_program(self.loss_function(cross_entropy_only=True), self.mesh)
        with self.backend.runtime(), jax.set_mesh(self.mesh):
            return self._evaluation(self.jax_params, *self.place_batch([batch]))

    def place_batch(self, micro_batches: list[Batch]) -> tuple[Any, ...]:
        """The micro-batches stacked to [A, ...] and put on the mesh (``titanpod.graph.xla.batches``): tokens,
        labels (and document ids) [A, B, S] sharded alike, or one dict of named tensors."""
        return place_micro_batches(micro_batches, self.model, self.mesh, self.axes)

    def named_sharding(self, name: str) -> Any:
        """The sharding of the named batch tensor ``name`` [A, B, ...]: B split over the data axes, or whole on
        every device for one of the model's ``shared_batch_inputs``."""
        return named_batch_sharding(name, self.model, self.mesh, self.axes)

    def _arguments(self, micro_batches: list[Batch], lr: float) -> tuple:
        import jax

        batch_arrays = self.place_batch(micro_batches)
        lr_array = jax.device_put(np.float32(lr), replicated(self.mesh))  # an argument, so no recompile per lr
        state = self.state
        return (self.jax_params, state.exp_avg, state.exp_avg_sq, state.step, lr_array, *batch_arrays)

    def lower(self, micro_batches: list[Batch], lr: float = 0.0) -> Any:
        """The step's ``jax.stages.Lowered`` for batches like ``micro_batches`` (for its HLO, cost and memory)."""
        import jax

        with self.backend.runtime(), jax.set_mesh(self.mesh):
            return self.program.lower(*self._arguments(micro_batches, lr))

    @property
    def compiled_programs(self) -> int:
        """Programs this step has compiled (or loaded from the cache) so far: one per batch shape it has seen."""
        return len(self._compiled)

    def _compiled_program(self, arguments: tuple) -> Any:
        """The program compiled for these arguments' batch shapes: compiled (or loaded) on first sight."""
        batch = arguments[5:]
        named = batch[0].items() if batch and isinstance(batch[0], Mapping) else enumerate(batch)
        key = tuple((name, array.shape, array.dtype) for name, array in named)
        if key not in self._compiled:
            compiled, self.compile_report = compile_lowered(lambda: self.program.lower(*arguments), self._cache_folder)
            self.program_figures = program_figures(compiled, None)
            self._compiled[key] = compiled
        return self._compiled[key]

    program_figures: ProgramFigures | None = None
    """What the compiler says of the step's last compiled program: bytes a device, flops, its time estimate."""

    @property
    def estimated_step_seconds(self) -> float | None:
        """The compiler's estimate of one step's time on the device (TPU only); ``None`` without one, and where the
        blocks run as a layer scan, whose body the estimate counts once."""
        figures = self.program_figures
        if figures is None or self.layer_stack.stacks_any:
            return None
        return figures.optimal_seconds

    def __call__(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        import jax

        # The mesh in context: kernels (titanpod.kernels' jax_op) split their Pallas calls over it.
        with self.backend.runtime(), jax.set_mesh(self.mesh):
            arguments = self._arguments(micro_batches, lr)
            program = self._compiled_program(arguments)
            try:
                outputs = program(*arguments)
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                memory = None if self.program_figures is None else self.program_figures.memory
                raise out_of_device_memory(error, memory, self.backend.memory_stats(), self.config) from error
        self.jax_params, exp_avg, exp_avg_sq, step, loss, grad_norm, applied, metrics = outputs
        self.state = AdamWState(step, exp_avg, exp_avg_sq)
        return StepOutput(loss, grad_norm, applied, metrics)


def _device_bytes(array: Any) -> int:
    """Bytes of ``array`` on each device that holds a shard of it."""
    return math.prod(array.sharding.shard_shape(array.shape)) * array.dtype.itemsize


def block_list_counts(model: nn.Module) -> dict[str, int]:
    """Each list of transformer blocks of ``model`` (``titanpod.graph.blocks``: a decoder's ``layers``, FLUX's
    ``transformer.double_blocks`` and ``transformer.single_blocks``) -> its blocks, in forward order."""
    counts: dict[str, int] = {}
    for path, _ in transformer_blocks(model):
        owner = path.rpartition(".")[0]
        counts[owner] = counts.get(owner, 0) + 1
    return counts
