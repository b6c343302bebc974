"""The xla step's state interface: its parameters and AdamW moments, jax arrays on a mesh (with the
transformer blocks' stacked or not), out as the trainer-state tree, back in, and into the torch model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from titanpod.graph.optimizer import AdamWState, state_tree
from titanpod.graph.step_base import StateFormat, TrainStep
from titanpod.graph.xla.layer_stack import LayerStack
from titanpod.graph.xla.moment_pieces import (
    MOMENT_PIECE_BYTES,
    Rows,
    joined_pieces,
    piece_rows,
    split_into_pieces,
)
from titanpod.graph.xla.state import load_state_tree
from titanpod.graph.xla.step_program import in_host_memory


class JaxStateStep(TrainStep):
    """A step that holds the parameters and optimizer state as jax arrays: ``state_dict()`` and
    ``load_state_dict`` speak of the model's own per-layer parameters, ``finish()`` copies them into the model.

    The subclass places the arrays (``jax_params``, ``state``) and sets their shardings and ``layer_stack``.
    """

    state_format: ClassVar[StateFormat] = "jax"
    """The step holds parameters and optimizer state as jax arrays: ``state_dict()`` is their tree, saved with Orbax."""

    layer_stack: LayerStack
    """The step's arrays (``jax_params``, the moments) and the model's parameters each holds."""
    jax_params: list[Any]
    """The step's parameters, one array per ``layer_stack`` entry."""
    name_shardings: dict[str, Any]
    """Each model parameter's sharding (a block's own, inside a stack)."""
    param_shardings: list[Any]
    """The sharding of each of the step's arrays."""

    def _entry_shardings(self) -> list[Any]:
        """The sharding of each of the step's arrays, from ``name_shardings``."""
        stack = self.layer_stack
        return [stack.entry_sharding(i, s) for i, s in enumerate(stack.per_entry(self.name_shardings))]

    moments_in_host_memory: bool = False
    """AdamW's moments live in host memory (``TrainConfig.optimizer_offload``), each entry's as pieces along its first
    axis (``moment_rows``); a checkpoint's save or restore joins and splits them one entry at a time, so it never
    holds them all on the devices."""
    moment_rows: tuple[Rows, ...] = ()
    """With the moments in host memory: each entry's pieces (``titanpod.graph.xla.moment_pieces.piece_rows``)."""
    moment_piece_bytes: ClassVar[int] = MOMENT_PIECE_BYTES
    """The most bytes a device holds of one piece of one moment in host memory."""

    def _set_moment_rows(self) -> None:
        """``moment_rows`` from the entries' shapes and shardings (call once ``param_shardings`` is set)."""
        if self.moments_in_host_memory:
            self.moment_rows = tuple(
                piece_rows(p.shape, s, self.moment_piece_bytes)
                for p, s in zip(self.jax_params, self.param_shardings, strict=True)
            )

    def _stacked(self, per_name: list[Any]) -> list[Any]:
        """The step's arrays from the model's parameters' (laid out as ``param_shardings``): one jitted copy."""
        import jax

        arrays = dict(zip(self.names, per_name, strict=True))
        return jax.jit(self.layer_stack.stack, out_shardings=self.param_shardings)(arrays)

    def _unstacked(self, entries: list[Any]) -> list[Any]:
        """The model's parameters' arrays (in ``names`` order) from the step's; copies when any entry is stacked."""
        import jax

        stack = self.layer_stack
        if not stack.stacks_any:
            return list(entries)
        shardings = {name: self.name_shardings[name] for name in self.names}
        per_name = jax.jit(stack.unstack, out_shardings=shardings)(list(entries))
        return [per_name[name] for name in self.names]

    def _moment_pieces(self, per_name: list[Any]) -> list[list[Any]]:
        """Moments in host memory as the step holds them (each entry's pieces) from the model's parameters' (in
        ``names`` order): one entry at a time, each piece left in host memory."""
        import jax
        import jax.numpy as jnp

        stack, arrays = self.layer_stack, dict(zip(self.names, per_name, strict=True))
        shardings = in_host_memory(self.param_shardings)
        entries = []
        for index, (members, rows) in enumerate(zip(stack.members, self.moment_rows, strict=True)):
            if not stack.is_stacked(index):
                entries.append(split_into_pieces(arrays[members[0]], rows, shardings[index]))
                continue
            stack_piece = jax.jit(jnp.stack, out_shardings=shardings[index])
            entries.append([stack_piece([arrays[name] for name in members[start:stop]]) for start, stop in rows])
        return entries

    def _moments_per_name(self, entries: list[list[Any]]) -> list[Any]:
        """The model's parameters' moments (in ``names`` order) from the step's pieces in host memory: one entry at
        a time, each block's slice or joined tensor left in host memory."""
        import jax

        stack, per_name = self.layer_stack, {}
        for index, (members, pieces) in enumerate(zip(stack.members, entries, strict=True)):
            host = in_host_memory([self.name_shardings[name] for name in members])
            if not stack.is_stacked(index):
                per_name[members[0]] = joined_pieces(pieces, host[0])
                continue
            for (start, stop), piece in zip(self.moment_rows[index], pieces, strict=True):
                split = jax.jit(lambda stacked: list(stacked), out_shardings=host[start:stop])(piece)
                per_name.update(zip(members[start:stop], split, strict=True))
        return [per_name[name] for name in self.names]

    def state_dict(self) -> dict[str, Any]:
        """The step's parameters and AdamW state as the trainer-state checkpoint layout, holding its jax arrays:
        ``{"model": {name: array}, "optim": {"step": array, "exp_avg": {name: array}, "exp_avg_sq": {name: array}}}``.

        The arrays are the step's own, sharded on its mesh; the next step donates them, so save
        them (or copy them) before stepping again. The xla step uses no random state: no "rng" key.
        """
        state = self.state
        if self.moments_in_host_memory:
            avg, avg_sq = self._moments_per_name(state.exp_avg), self._moments_per_name(state.exp_avg_sq)
            state = AdamWState(state.step, avg, avg_sq)
        elif self.layer_stack.stacks_any:
            state = AdamWState(state.step, self._unstacked(state.exp_avg), self._unstacked(state.exp_avg_sq))
        return state_tree(self.names, self._unstacked(self.jax_params), state)

    def state_like(self) -> dict[str, Any]:
        """``state_dict()``'s tree as ``jax.ShapeDtypeStruct``s (each entry's shape, dtype and sharding), read off the
        step's arrays without copying any: what a restore reads into and checks against. With the moments in host
        memory, ``state_dict()`` joins every moment's pieces; this joins none."""
        import jax

        def like(shape: tuple[int, ...], dtype: Any, sharding: Any) -> Any:
            return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

        stack, offloaded = self.layer_stack, self.moments_in_host_memory
        params, moments = {}, {}
        for index, (members, entry) in enumerate(zip(stack.members, self.jax_params, strict=True)):
            shape = tuple(entry.shape[1:] if stack.is_stacked(index) else entry.shape)
            moment = self.state.exp_avg[index][0] if offloaded else self.state.exp_avg[index]
            for name in members:
                sharding = self.name_shardings[name]
                params[name] = like(shape, entry.dtype, sharding)
                moments[name] = like(shape, moment.dtype, in_host_memory([sharding])[0] if offloaded else sharding)
        step = self.state.step
        per_name = [moments[name] for name in self.names]
        state = AdamWState(like(step.shape, step.dtype, step.sharding), per_name, list(per_name))
        return state_tree(self.names, [params[name] for name in self.names], state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put a ``state_dict``-layout tree of arrays (jax or numpy) into the step, each on the step's own sharding.

        Every entry of ``state_dict()`` must be there with the same shape and dtype (an "rng"
        entry, if any, is ignored); a missing, unexpected or mismatched entry raises
        ``ValueError`` naming it. The step gets its own copies: ``state`` stays valid after the next step.
        """
        with self.backend.runtime():
            params, loaded = load_state_tree(self.names, self.state_like(), state)
            if self.layer_stack.stacks_any:
                params = self._stacked(params)
            if self.moments_in_host_memory:
                loaded = AdamWState(
                    loaded.step, self._moment_pieces(loaded.exp_avg), self._moment_pieces(loaded.exp_avg_sq)
                )
            elif self.layer_stack.stacks_any:
                loaded = AdamWState(loaded.step, self._stacked(loaded.exp_avg), self._stacked(loaded.exp_avg_sq))
            self.jax_params, self.state = params, loaded

    def finish(self) -> None:
        """Copy the trained parameters from the JAX devices into the torch model (waits for the device); a model
        left on the meta device is first materialised on the host."""
        if any(param.is_meta for param in self.params):
            self.model.to_empty(device="cpu")  # new parameter objects: read them again
            self.params = [param for _, param in self.model.named_parameters()]
        with torch.no_grad(), self.backend.runtime():
            for param, array in zip(self.params, self._unstacked(self.jax_params), strict=True):
                param.data.copy_(torch.from_numpy(np.array(array)))  # np.array: a writable host copy
