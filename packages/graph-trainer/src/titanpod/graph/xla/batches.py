"""A step's micro-batches on the xla step's mesh: stacked to [A, ...] and placed, split over the data axes.

Legend: A micro-batches per step, B batch, S sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from titanpod.graph.step_base import Batch, stack_micro_batches, stack_named_batches
from titanpod.graph.xla.mesh import batch_sharding


def place_micro_batches(
    micro_batches: list[Batch], model: nn.Module, mesh: Any, axes: Mapping[str, int]
) -> tuple[Any, ...]:
    """Stack the micro-batches to tokens and labels [A, B, S] (and document ids, when the batches are
    3-tuples) and put them on ``mesh``, each sharded like the tokens (``titanpod.graph.xla.mesh.batch_sharding``).

    Batches of named tensors become one dict of arrays [A, B, ...], B split over the data axes,
    except the tensors ``model`` names in ``shared_batch_inputs`` (no batch dimension, e.g. FLUX's
    position ids): those are whole on every device."""
    import jax

    if any(isinstance(batch, Mapping) for batch in micro_batches):
        return (_place_named(stack_named_batches(micro_batches), model, mesh, axes),)
    sharding = batch_sharding(mesh, axes)
    stacked = [t for t in stack_micro_batches(micro_batches) if t is not None]
    return tuple(jax.device_put(np.asarray(t.cpu()), sharding) for t in stacked)


def named_batch_sharding(name: str, model: nn.Module, mesh: Any, axes: Mapping[str, int]) -> Any:
    """The sharding of the named batch tensor ``name`` [A, B, ...]: B split over the data axes, or whole on
    every device for one of ``model``'s ``shared_batch_inputs``."""
    from jax.sharding import NamedSharding, PartitionSpec

    from titanpod.parallel.xla_executor import batch_partition_spec

    if name in set(getattr(model, "shared_batch_inputs", ())):
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, PartitionSpec(None, *batch_partition_spec(axes, 1)))


def _place_named(
    named_A: dict[str, torch.Tensor], model: nn.Module, mesh: Any, axes: Mapping[str, int]
) -> dict[str, Any]:
    import jax

    return {
        name: jax.device_put(np.asarray(value.cpu()), named_batch_sharding(name, model, mesh, axes))
        for name, value in named_A.items()
    }
