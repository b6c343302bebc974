"""Output projection + cross-entropy as Pallas kernels (for the TPU; interpret mode elsewhere).

Legend: N tokens, M model dim, V vocabulary; bn and bv the row and vocabulary tiles.

The forward walks the vocabulary in tiles per row tile, keeping a running max, sum of
exponentials and the target logit (an online logsumexp), and writes each row's loss
and logsumexp. The backward recomputes each tile's logits from those, forms
``softmax - one_hot`` scaled by the row's share of the mean, and accumulates the hidden
gradient (one kernel, over vocabulary tiles) and the weight gradient (another, over row
tiles). No [N, V] array exists at any point, nor a copy of the head: a vocabulary that is
not a multiple of bv ends in a partial tile, whose columns past V are masked (the rows of
the head read past its end hold whatever the buffer holds, so they are zeroed before use).
Each gradient is summed in a float32 tile of scratch and written once, in its input's
dtype. On the xla lane's mesh each data shard runs the kernels on its own rows, and the
shards' sums and counts make the global mean. Each kernel declares its cost
(``loss_cost_estimates``), which a compiled step's ``cost_analysis`` counts as the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from titanpod.kernels.jax_custom_op import JaxOp, free_op_name, jax_op, pallas_interpret
from titanpod.kernels.mesh_split import batch_axes
from titanpod.kernels.pallas.loss_kernel import (
    LOSS_MATMULS,
    VMEM_BUDGET,
    PallasLossConfig,
    fitted_tiles,
    loss_cost_estimates,
    loss_vmem_bytes,
    make_pallas_cross_entropy,
)
from titanpod.models import IGNORE_INDEX

__all__ = [
    "LOSS_MATMULS",
    "VMEM_BUDGET",
    "PallasLinearCrossEntropy",
    "PallasLossConfig",
    "fitted_tiles",
    "loss_cost_estimates",
    "loss_vmem_bytes",
    "make_pallas_cross_entropy",
]


def _per_shard(fn: Any, mesh: Any, h_NM: Any, _w_VM: Any, _labels_N: Any) -> Any:
    """The mean loss on ``mesh`` with each data shard's rows under ``jax.shard_map``: every shard's
    mean times its labelled rows, summed over the shards, over the labelled rows of all of them."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    rows = batch_axes(mesh, h_NM.shape[0])

    def shard_loss(h, w, labels):
        if rows is None:
            return fn(h, w, labels)
        count = (labels != IGNORE_INDEX).sum()
        total = jnp.where(count > 0, fn(h, w, labels) * count, 0.0)  # a shard with no labels adds nothing
        return jax.lax.psum(total, rows) / jax.lax.psum(count, rows)

    # check_vma=False: Pallas outputs carry no record of which mesh axes they vary over.
    in_specs = (P(rows, None), P(), P(rows))
    return jax.shard_map(shard_loss, mesh=mesh, in_specs=in_specs, out_specs=P(), check_vma=False)


@dataclass
class PallasLinearCrossEntropy:
    """Callable with the ``HeadLossOp`` signature, backed by the Pallas kernels above."""

    config: PallasLossConfig
    """Tiles."""

    def __post_init__(self) -> None:
        self._ops: dict[tuple[Any, ...], JaxOp] = {}

    def __call__(self, h_BSM: torch.Tensor, weight_VM: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
        if h_BSM.dtype != weight_VM.dtype or h_BSM.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"The Pallas loss takes float32 or bfloat16 hidden states and head of one dtype, got "
                            f"{h_BSM.dtype} and {weight_VM.dtype}.")  # fmt: skip
        vocab, dim = weight_VM.shape
        interpret = pallas_interpret(self.config.interpret, h_BSM.device)
        key = (vocab, dim, h_BSM.dtype, interpret)
        if key not in self._ops:
            fn = make_pallas_cross_entropy(self.config, vocab, dim, interpret, h_BSM.dtype.itemsize, IGNORE_INDEX)
            name = free_op_name(f"pallas_ce_{vocab}_{dim}_{str(h_BSM.dtype).split('.')[-1]}")
            self._ops[key] = jax_op(name, fn, shard=_per_shard)
        labels = labels_BS.reshape(-1).to(torch.int32)
        return self._ops[key](h_BSM.reshape(-1, dim), weight_VM, labels)
