"""The xla lane's step compiled ahead of time for devices this host does not own (a TPU slice's).

``AbstractXlaStep`` is ``XlaStep`` with nothing placed: its parameters and AdamW moments are
``jax.ShapeDtypeStruct``s carrying the plan's shardings on a mesh of abstract devices
(``titanpod.device.tpu_slices.abstract_devices``), so the step's ``jax.jit`` program (the very
function a pod runs: forward, loss, backward, gradient sum over micro-batches, clipping, AdamW)
lowers and compiles for the slice without a byte of weights. The model stays on the meta device.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from titanpod.device import Backend
from titanpod.graph.config import TrainConfig
from titanpod.graph.optimizer import AdamWState
from titanpod.graph.xla.mesh import replicated
from titanpod.graph.xla.moment_pieces import piece_shape
from titanpod.graph.xla.step import XlaStep
from titanpod.graph.xla.step_program import in_host_memory


@dataclass(frozen=True)
class BatchShape:
    """The shape of one step's batch as the program takes it: tokens and labels [A, B, S]."""

    micro_batches: int
    """A: micro-batches summed into one step (gradient accumulation)."""
    batch: int
    """B: sequences per micro-batch over the whole mesh (every data rank's batch)."""
    seq_len: int
    """S: tokens a sequence."""
    documents: bool = False
    """Whether the step also takes document ids [A, B, S] (document masking)."""


@dataclass(frozen=True)
class NamedBatchShape:
    """The shape of one step's batch of named tensors (e.g. FLUX's latents, noise, timesteps, text), as the
    program takes it: each [A, ...], the batch axis after A split over the data axes, except the model's
    ``shared_batch_inputs`` (no batch axis), which are whole on every device."""

    micro_batches: int
    """A: micro-batches summed into one step (gradient accumulation)."""
    batch: int
    """B: samples per micro-batch over the whole mesh (every data rank's batch)."""
    shapes: dict[str, tuple[int, ...]]
    """Name -> the shape of one micro-batch's tensor (without A; B first unless the tensor is shared)."""
    dtypes: dict[str, str]
    """Name -> its dtype as JAX names it (``float32``, ``int32`` ...)."""

    def __post_init__(self) -> None:
        if set(self.shapes) != set(self.dtypes):
            raise ValueError(f"A named batch needs a shape and a dtype for each tensor: {sorted(self.shapes)} and "
                             f"{sorted(self.dtypes)} differ.")  # fmt: skip


@dataclass
class CompiledStep:
    """A step compiled for abstract devices, and how long that took."""

    compiled: Any
    """The ``jax.stages.Compiled``: ``memory_analysis()``, ``cost_analysis()``, ``as_text()``."""
    trace_seconds: float
    """Wall time to trace and lower the step (the torch model run through torchax into StableHLO)."""
    compile_seconds: float
    """Wall time of the compiler (XLA and, for Pallas kernels, Mosaic)."""
    dump_dir: Path | None
    """Where the compiler wrote the program's HLO (before and after optimisation), when asked to."""


class AbstractXlaStep(XlaStep):
    """``XlaStep`` on a mesh of devices that need not exist: parameters and state are shapes with shardings.

    ``mesh`` is required (a ``jax.sharding.Mesh`` of abstract devices, axes as in ``axes``); the model may
    stay on the meta device. The step cannot be called or saved, only compiled (``compile``).
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        backend: Backend,
        plan: Any,
        axes: Mapping[str, int],
        mesh: Any,
        gather_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(model, config, backend, plan=plan, axes=axes, mesh=mesh, gather_dtype=gather_dtype)

    def initial_state(self) -> AdamWState:
        """The parameters and moments as ``ShapeDtypeStruct``s sharded by the plan (replicated without one)."""
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding

        from titanpod.parallel.xla_executor import param_partition_spec

        self.mesh = self._mesh
        whole = replicated(self.mesh)

        def sharding(name: str, ndim: int) -> Any:
            if self._plan is None:
                return whole
            return NamedSharding(self.mesh, param_partition_spec(self._plan, name, ndim, self.axes))

        self.name_shardings = {name: sharding(name, p.ndim) for name, p in zip(self.names, self.params, strict=True)}
        self.param_shardings = self._entry_shardings()
        stack = self.layer_stack
        shapes = stack.per_entry({name: tuple(p.shape) for name, p in zip(self.names, self.params, strict=True)})
        self.jax_params = [
            jax.ShapeDtypeStruct(stack.entry_shape(i, shape), jnp.float32, sharding=s)
            for i, (shape, s) in enumerate(zip(shapes, self.param_shardings, strict=True))
        ]
        self._set_moment_rows()
        if self.moments_in_host_memory:  # each entry's pieces
            host = in_host_memory(self.param_shardings)
            moments: list[Any] = [
                [jax.ShapeDtypeStruct(piece_shape(p.shape, piece), jnp.float32, sharding=s) for piece in rows]
                for p, s, rows in zip(self.jax_params, host, self.moment_rows, strict=True)
            ]
        else:
            moments = [
                jax.ShapeDtypeStruct(p.shape, jnp.float32, sharding=s)
                for p, s in zip(self.jax_params, self.moment_shardings, strict=True)
            ]
        return AdamWState(jax.ShapeDtypeStruct((), jnp.float32, sharding=whole), moments, list(moments))  # type: ignore[arg-type]

    def abstract_arguments(self, shape: BatchShape | NamedBatchShape) -> tuple[Any, ...]:
        """The program's arguments for batches of ``shape``: the state, the learning rate and [A, B, S] int32
        tokens and labels (and document ids), or one dict of named [A, ...] tensors, all ``ShapeDtypeStruct``s."""
        import jax
        import jax.numpy as jnp

        lr = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated(self.mesh))
        state = (self.jax_params, self.state.exp_avg, self.state.exp_avg_sq, self.state.step, lr)
        if isinstance(shape, NamedBatchShape):
            named = {
                name: jax.ShapeDtypeStruct(
                    (shape.micro_batches, *dims), jnp.dtype(shape.dtypes[name]), sharding=self.named_sharding(name)
                )
                for name, dims in shape.shapes.items()
            }
            return (*state, named)
        tokens = jax.ShapeDtypeStruct(
            (shape.micro_batches, shape.batch, shape.seq_len), jnp.int32, sharding=self.batch_sharding()
        )
        batch = (tokens, tokens, tokens) if shape.documents else (tokens, tokens)
        return (*state, *batch)

    def compile(
        self, shape: BatchShape | NamedBatchShape, dump_dir: Path | None = None, options: Mapping[str, Any] = ()
    ) -> CompiledStep:
        """Trace, lower and compile the step for batches of ``shape``; ``dump_dir`` keeps the compiler's HLO.

        ``options`` are XLA compiler options (``DebugOptions`` fields, e.g. libtpu's ``xla_tpu_*`` flags).
        """
        import jax

        compiler_options = dict(options)
        if dump_dir is not None:
            dump_dir.mkdir(parents=True, exist_ok=True)
            compiler_options |= {"xla_dump_to": str(dump_dir), "xla_dump_hlo_as_text": True}
        started = time.perf_counter()
        with self.backend.runtime(), jax.set_mesh(self.mesh):
            lowered = self.program.lower(*self.abstract_arguments(shape))
        traced = time.perf_counter()
        compiled = lowered.compile(compiler_options=compiler_options or None)
        return CompiledStep(compiled, traced - started, time.perf_counter() - traced, dump_dir)

    def __call__(self, *_: Any, **__: Any) -> Any:
        raise TypeError("An AbstractXlaStep only compiles (its devices may not exist); build an XlaStep to train.")


def device_mesh(devices: list[Any], axes: Mapping[str, int]) -> Any:
    """A ``jax.sharding.Mesh`` of ``devices`` (abstract ones too) shaped by ``axes`` (name -> size, outermost
    first, their product the number of devices)."""
    import jax
    import numpy as np

    return jax.sharding.Mesh(np.asarray(devices).reshape(tuple(axes.values())), tuple(axes))


def serialized_executable(compiled: Any) -> bytes:
    """``compiled`` (a ``jax.stages.Compiled``) as the bytes JAX's ``serialize_executable`` writes."""
    from jax.experimental import serialize_executable

    payload, _, _ = serialize_executable.serialize(compiled)
    return payload
