"""Grouped matmul for MoE experts: JAX's megablox ``gmm`` (its ``tgmm`` gives the weight gradient).

Legend: E experts, C rows per expert (its capacity), T rows of all experts (E x C), I input
width, O output width, M model width, F expert hidden width (an expert MLP maps M to F to M).

Each expert's rows arrive as a fixed-size buffer (``ExpertMatmulOp``), so the groups are E
consecutive runs of C rows: sizes fixed by the shape, never read from the device. ``gmm``
needs the rows in whole tiles, so they are padded with rows of no group (which it leaves as
zeros) and cut back. Tile widths are the largest divisors of the matrix widths
up to the configured ones. Off a TPU, Pallas runs in interpret mode.

On the xla lane's mesh the MoE layer routes each data shard's tokens where they are
(``per_batch_shard``, the op's ``BatchShards``), so its buffers come as [E, G x C, I] with the
rows of data shard g at g x C: the kernel runs per shard on its own rows of every expert,
sends each expert's rows to the ``ep`` rank holding that expert (an all-to-all over ``ep``),
multiplies them there and sends the results back the same way. The experts' whole SwiGLU MLP
(``swiglu``: gate, up, activation, down) makes that trip once, not once for each of its three
matmuls: a third of the all-to-alls, and about half their bytes. Per chip that is the chip's
own buffers, E x C rows, whatever the size of the mesh. Buffers not laid out so (rows that
do not split over every data axis) run with experts over ``ep`` and rows over the other data
axes.
megablox declares its own cost estimates (2 x rows x I x O for ``gmm`` and for ``tgmm``, the
padding rows included), so a compiled step's ``cost_analysis`` counts 6 T I O a matmul for forward
and backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from titanpod.kernels.jax_custom_op import JaxOp, free_op_name, holds_torchax_tensors, jax_op, pallas_interpret
from titanpod.kernels.mesh_split import batch_axes
from titanpod.kernels.pallas.gmm_kernel import GroupedMatmulConfig, tiled_gmm

__all__ = ["GroupedMatmulConfig", "MegabloxGroupedMatmul"]


@dataclass
class MegabloxGroupedMatmul:
    """Callable with the ``ExpertMatmulOp`` signature, backed by megablox ``gmm``; its ``swiglu`` is the
    ``ExpertSwigluOp`` of the same kernel (the three matmuls of every expert's MLP as one op)."""

    config: GroupedMatmulConfig = field(default_factory=GroupedMatmulConfig)
    """Tiles."""
    _ops: dict[tuple[Any, ...], JaxOp] = field(default_factory=dict, repr=False)

    gathers_weights: ClassVar[bool] = True
    """On the xla lane's mesh the op gathers the experts' weights over the data axes itself, inside its
    ``shard_map`` (whose backward then reduce-scatters their gradients): a step hands them over as stored."""

    def _tiled_gmm(self, interpret: bool) -> Any:
        """``gmm(x_TI, w_EOI, E, C)``: the grouped matmul of E groups of C rows over rows padded to whole tiles
        (``x_TI`` already padded; the padding rows, of no group, come out zero)."""
        gmm = tiled_gmm(self.config, interpret)

        def uniform(x_TI: Any, w_EOI: Any, E: int, C: int) -> Any:
            import jax.numpy as jnp

            return gmm(x_TI, w_EOI, jnp.full((E,), C, jnp.int32))

        return uniform

    def _padded(self, x_ECI: Any) -> Any:
        """The buffers' rows [T padded to whole tiles, I]."""
        import jax.numpy as jnp

        E, C, I = x_ECI.shape  # noqa: E741 - I: legend
        return jnp.pad(x_ECI.reshape(E * C, I), ((0, -(E * C) % self.config.tile_rows), (0, 0)))

    def _op(self, I: int, O: int, dtype: torch.dtype, device: torch.device) -> JaxOp:  # noqa: E741 - I: legend
        interpret = pallas_interpret(self.config.interpret, device)
        key = (I, O, dtype, interpret)
        if key not in self._ops:
            gmm = self._tiled_gmm(interpret)

            def grouped(x_ECI: Any, w_EOI: Any) -> Any:
                E, C, _ = x_ECI.shape
                return gmm(self._padded(x_ECI), w_EOI, E, C)[: E * C].reshape(E, C, O)

            name = free_op_name(f"gmm_{I}_{O}_{str(dtype).split('.')[-1]}")
            self._ops[key] = jax_op(name, grouped, shard=_per_shard)
        return self._ops[key]

    def _swiglu_op(self, M: int, F: int, dtype: torch.dtype, device: torch.device) -> JaxOp:
        interpret = pallas_interpret(self.config.interpret, device)
        key = ("swiglu", M, F, dtype, interpret)
        if key not in self._ops:
            gmm = self._tiled_gmm(interpret)

            def swiglu(x_ECM: Any, w1_EFM: Any, w3_EFM: Any, w2_EMF: Any) -> Any:
                import jax

                E, C, _ = x_ECM.shape
                x_TM = self._padded(x_ECM)  # padding rows stay zero through all three: silu(0) x 0 = 0
                h_TF = jax.nn.silu(gmm(x_TM, w1_EFM, E, C)) * gmm(x_TM, w3_EFM, E, C)
                return gmm(h_TF, w2_EMF, E, C)[: E * C].reshape(E, C, M)

            name = free_op_name(f"gmm_swiglu_{M}_{F}_{str(dtype).split('.')[-1]}")
            self._ops[key] = jax_op(name, swiglu, shard=_per_shard)
        return self._ops[key]

    def __call__(self, x_ECI: torch.Tensor, w_EOI: torch.Tensor) -> torch.Tensor:
        """``x_ECI[e] @ w_EOI[e].T`` for every expert e, [E, C, O], as one grouped matmul over E x C rows."""
        _check_dtypes(x_ECI, w_EOI)
        E, _, I = x_ECI.shape  # noqa: E741 - I is the legend's input width
        if w_EOI.shape[0] != E or w_EOI.shape[2] != I:
            raise ValueError(f"The grouped matmul takes rows [E, C, I] and weights [E, O, I] of one E and I, got "
                             f"{list(x_ECI.shape)} and {list(w_EOI.shape)}.")  # fmt: skip
        return self._op(I, w_EOI.shape[1], x_ECI.dtype, x_ECI.device)(x_ECI, w_EOI)

    def swiglu(
        self, x_ECM: torch.Tensor, w1_EFM: torch.Tensor, w3_EFM: torch.Tensor, w2_EMF: torch.Tensor
    ) -> torch.Tensor:
        """Every expert's SwiGLU MLP, ``(silu(x_ECM[e] @ w1_EFM[e].T) * (x_ECM[e] @ w3_EFM[e].T)) @ w2_EMF[e].T``,
        [E, C, M], as three grouped matmuls in one op: on the xla lane's mesh each expert's rows travel to
        its ``ep`` rank and back once for the whole MLP."""
        _check_dtypes(x_ECM, w1_EFM, w3_EFM, w2_EMF)
        E, _, M = x_ECM.shape
        F = w1_EFM.shape[1]
        if w1_EFM.shape != (E, F, M) or w3_EFM.shape != (E, F, M) or w2_EMF.shape != (E, M, F):
            raise ValueError(
                f"The experts' SwiGLU takes rows [E, C, M], gate and up weights [E, F, M] and down weights "
                f"[E, M, F], got {list(x_ECM.shape)}, {list(w1_EFM.shape)}, {list(w3_EFM.shape)} and "
                f"{list(w2_EMF.shape)}."
            )
        return self._swiglu_op(M, F, x_ECM.dtype, x_ECM.device)(x_ECM, w1_EFM, w3_EFM, w2_EMF)

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


def _check_dtypes(*tensors: torch.Tensor) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or not dtypes <= {torch.float32, torch.bfloat16}:
        names = ", ".join(str(t.dtype) for t in tensors)
        raise TypeError(f"The grouped matmul takes float32 or bfloat16 inputs of one dtype, got {names}.")


def _per_shard(fn: Any, mesh: Any, x_ECI: Any, *weights_E: Any) -> Any:
    """``fn`` (rows, then weights with a leading expert dimension) under ``jax.shard_map`` on ``mesh``.

    Rows that split over every data axis (the MoE layer's buffers, routed per data shard): each shard
    holds its own rows of every expert; an all-to-all over ``ep`` brings each expert's rows from every
    ``ep`` rank to the rank holding that expert's weights, ``fn`` runs there (one matmul, or a whole MLP),
    and one more all-to-all takes the results back. Otherwise: experts over ``ep`` (each shard holds its
    experts' weights whole) and each expert's rows over the other data axes.

    The weights enter split over the data axes other than ``ep`` along their second dimension, as FSDP
    stores them, and are gathered inside: the gather's backward reduce-scatters their gradients there. Taken
    in whole, each shard's gradient left as a whole-size all-reduce (a psum) that stayed live until the
    optimizer sliced it, one set a layer."""
    import jax
    from jax.sharding import PartitionSpec as P

    ep = mesh.shape.get("ep", 1)
    E, R, _ = x_ECI.shape
    own = batch_axes(mesh, R)
    experts = "ep" if ep > 1 and E % ep == 0 else None
    splits = [batch_axes(mesh, w.shape[1], besides=("ep",)) for w in weights_E]
    weight_specs = tuple(P(experts, split, None) for split in splits)

    def gathered(*weights: Any) -> list[Any]:
        return [w if split is None else jax.lax.all_gather(w, split, axis=1, tiled=True)
                for w, split in zip(weights, splits, strict=True)]  # fmt: skip

    if experts and own is not None and "ep" in own:

        def exchanged(x_ErI: Any, *weights_L: Any) -> Any:
            x_LRI = jax.lax.all_to_all(x_ErI, "ep", 0, 1, tiled=True)  # L = E / ep experts, every ep rank's rows
            return jax.lax.all_to_all(fn(x_LRI, *gathered(*weights_L)), "ep", 1, 0, tiled=True)

        return jax.shard_map(
            exchanged,
            mesh=mesh,
            in_specs=(P(None, own, None), *weight_specs),
            out_specs=P(None, own, None),
            check_vma=False,
        )
    rows = batch_axes(mesh, x_ECI.shape[1], besides=("ep",) if experts else ())

    def local(x_ErI: Any, *weights_L: Any) -> Any:
        return fn(x_ErI, *gathered(*weights_L))

    # check_vma=False: Pallas outputs carry no record of which mesh axes they vary over.
    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(P(experts, rows, None), *weight_specs),
        out_specs=P(experts, rows, None),
        check_vma=False,
    )
