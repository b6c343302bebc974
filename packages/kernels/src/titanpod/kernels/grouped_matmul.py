"""Grouped matmul for MoE experts: JAX's megablox ``gmm`` (its ``tgmm`` gives the weight gradient).

Legend: E experts, C rows per expert (its capacity), T rows of all experts (E x C), I input
width, O output width.

Each expert's rows arrive as a fixed-size buffer (``ExpertMatmulOp``), so the groups are E
consecutive runs of C rows: sizes fixed by the shape, never read from the device. ``gmm``
needs the rows in whole tiles, so they are padded with rows of no group (which it leaves as
zeros) and cut back. Tile widths are the largest divisors of the matrix widths
up to the configured ones. Off a TPU, Pallas runs in interpret mode.

On the xla lane's mesh the MoE layer routes each data shard's tokens where they are
(``per_batch_shard``, the op's ``BatchShards``), so its buffers come as [E, G x C, I] with the
rows of data shard g at g x C: the kernel runs per shard on its own rows of every expert,
sends each expert's rows to the ``ep`` rank holding that expert (an all-to-all over ``ep``),
multiplies them there and sends the results back the same way. Per chip that is the chip's
own buffers, E x C rows, whatever the size of the mesh. Buffers not laid out so (rows that
do not split over every data axis) run with experts over ``ep`` and rows over the other data
axes.
megablox declares its own cost estimates (2 x rows x I x O for ``gmm`` and for ``tgmm``, the
padding rows included), so a compiled step's ``cost_analysis`` counts 6 T I O for forward and
backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from titanpod.kernels.jax_op import JaxOp, free_op_name, holds_torchax_tensors, jax_op, pallas_interpret
from titanpod.kernels.mesh_split import batch_axes


@dataclass(frozen=True)
class GroupedMatmulConfig:
    """Tiles of the grouped matmul."""

    tile_rows: int = 128
    """Rows per tile; rows are padded to a multiple of it."""
    tile_in: int = 128
    """Input-width tile (the largest divisor of the width up to this)."""
    tile_out: int = 128
    """Output-width tile (the largest divisor of the width up to this)."""
    interpret: bool | None = None
    """Run Pallas in interpret mode; ``None`` does so unless the tensors are on a TPU (see ``pallas_interpret``)."""


@dataclass
class MegabloxGroupedMatmul:
    """Callable with the ``ExpertMatmulOp`` signature, backed by megablox ``gmm``."""

    config: GroupedMatmulConfig = field(default_factory=GroupedMatmulConfig)
    """Tiles."""
    _ops: dict[tuple[Any, ...], JaxOp] = field(default_factory=dict, repr=False)

    def _op(self, I: int, O: int, dtype: torch.dtype, device: torch.device) -> JaxOp:  # noqa: E741 - I: legend
        interpret = pallas_interpret(self.config.interpret, device)
        key = (I, O, dtype, interpret)
        if key not in self._ops:
            import jax.numpy as jnp
            from jax.experimental.pallas.ops.tpu.megablox import ops

            tiling = (self.config.tile_rows, math.gcd(I, self.config.tile_in), math.gcd(O, self.config.tile_out))
            tile_rows = self.config.tile_rows

            def grouped(x_ECI: Any, w_EOI: Any) -> Any:
                E, C, _ = x_ECI.shape
                T = E * C
                x_TI = jnp.pad(x_ECI.reshape(T, I), ((0, -T % tile_rows), (0, 0)))
                sizes_E = jnp.full((E,), C, jnp.int32)
                # positional: preferred dtype, tiling, group_offset, existing_out, transpose_rhs, interpret
                out = ops.gmm(x_TI, w_EOI, sizes_E, x_ECI.dtype, tiling, None, None, True, interpret)
                return out[:T].reshape(E, C, O)

            name = free_op_name(f"gmm_{I}_{O}_{str(dtype).split('.')[-1]}")
            self._ops[key] = jax_op(name, grouped, shard=_per_shard)
        return self._ops[key]

    def __call__(self, x_ECI: torch.Tensor, w_EOI: torch.Tensor) -> torch.Tensor:
        """``x_ECI[e] @ w_EOI[e].T`` for every expert e, [E, C, O], as one grouped matmul over E x C rows."""
        if x_ECI.dtype != w_EOI.dtype or x_ECI.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"The grouped matmul takes float32 or bfloat16 inputs of one dtype, got {x_ECI.dtype} "
                            f"and {w_EOI.dtype}.")  # fmt: skip
        E, _, I = x_ECI.shape  # noqa: E741 - I is the legend's input width
        if w_EOI.shape[0] != E or w_EOI.shape[2] != I:
            raise ValueError(f"The grouped matmul takes rows [E, C, I] and weights [E, O, I] of one E and I, got "
                             f"{list(x_ECI.shape)} and {list(w_EOI.shape)}.")  # fmt: skip
        return self._op(I, w_EOI.shape[1], x_ECI.dtype, x_ECI.device)(x_ECI, w_EOI)

    def per_batch_shard(self, fn: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The MoE layer's ``BatchShards``: on the xla lane (torchax tensors) under a mesh of several devices,
        ``fn`` (a torch function) once per data shard, under ``jax.shard_map``: the tensors' first dimension
        split over the data axes as the step lays out the batch, and so each output's. Elsewhere, or when the
        data axes do not divide the batch, ``fn`` on the whole batch, as one shard. (Context-parallel ranks
        of a shard each route its whole stretch of rows, the same.)"""
        if not holds_torchax_tensors(tensors):
            return fn(*tensors)
        import jax
        from jax.sharding import PartitionSpec as P
        from torchax.interop import jax_view, torch_view

        mesh = jax.sharding.get_abstract_mesh()
        axes = None if mesh.empty or mesh.size == 1 else batch_axes(mesh, tensors[0].shape[0])
        if axes is None:
            return fn(*tensors)
        spec = P(axes)
        # check_vma=False: the outputs vary over every data axis, as their specs say.
        run = jax.shard_map(
            jax_view(fn), mesh=mesh, in_specs=tuple(spec for _ in tensors), out_specs=spec, check_vma=False
        )
        return tuple(torch_view(run(*jax_view(list(tensors)))))


def _per_shard(fn: Any, mesh: Any, x_ECI: Any, _w_EOI: Any) -> Any:
    """``fn`` under ``jax.shard_map`` on ``mesh``, a gmm per shard.

    Rows that split over every data axis (the MoE layer's buffers, routed per data shard): each shard
    holds its own rows of every expert; an all-to-all over ``ep`` brings each expert's rows from every
    ``ep`` rank to the rank holding that expert's weights, and one more takes the results back. Otherwise:
    experts over ``ep`` (each shard holds its experts' weights whole) and each expert's rows over the other
    data axes."""
    import jax
    from jax.sharding import PartitionSpec as P

    ep = mesh.shape.get("ep", 1)
    E, R, _ = x_ECI.shape
    own = batch_axes(mesh, R)
    if ep > 1 and E % ep == 0 and own is not None and "ep" in own:

        def exchanged(x_ErI: Any, w_LOI: Any) -> Any:
            x_LRI = jax.lax.all_to_all(x_ErI, "ep", 0, 1, tiled=True)  # L = E / ep experts, every ep rank's rows
            return jax.lax.all_to_all(fn(x_LRI, w_LOI), "ep", 1, 0, tiled=True)

        return jax.shard_map(
            exchanged,
            mesh=mesh,
            in_specs=(P(None, own, None), P("ep", None, None)),
            out_specs=P(None, own, None),
            check_vma=False,
        )
    experts = "ep" if ep > 1 and E % ep == 0 else None
    rows = batch_axes(mesh, x_ECI.shape[1], besides=("ep",) if experts else ())
    # check_vma=False: Pallas outputs carry no record of which mesh axes they vary over.
    return jax.shard_map(
        fn,
        mesh=mesh,
        in_specs=(P(experts, rows, None), P(experts, None, None)),
        out_specs=P(experts, rows, None),
        check_vma=False,
    )
