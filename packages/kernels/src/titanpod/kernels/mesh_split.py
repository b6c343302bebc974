"""Which axes of the xla lane's mesh split a kernel's batch, and which its heads.

A Pallas call cannot be partitioned by XLA, so on a mesh of several devices each kernel
runs under ``jax.shard_map`` on its own slice. The mesh's axes are those of
``titanpod.parallel``: ``tp`` (and ``cp``) split the model; every other axis
(``dp_replicate``, ``fsdp``, ``ep``) splits the batch, as the xla executor's
``batch_partition_spec`` lays out the step's tokens.
"""

from __future__ import annotations

import math
from typing import Any

MODEL_AXES = ("tp", "cp")
"""Mesh axes that split the model (heads, widths, sequence), not the batch."""


def batch_axes(mesh: Any, rows: int, besides: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The axes of ``mesh`` (a ``jax.sharding.Mesh`` or ``AbstractMesh``) that split a batch of
    ``rows``: every axis of size > 1 that is not a model axis (nor one of ``besides``, split
    elsewhere), outermost first; ``None`` when there is none or their product does not divide
    ``rows`` (the batch then stays whole)."""
    skip = (*MODEL_AXES, *besides)
    axes = tuple(name for name, size in mesh.shape.items() if size > 1 and name not in skip)
    if not axes or rows % math.prod(mesh.shape[name] for name in axes):
        return None
    return axes


def head_axis(mesh: Any, *head_counts: int) -> str | None:
    """``"tp"`` when the mesh has a tp axis that divides every one of ``head_counts``, else ``None``."""
    tp = mesh.shape.get("tp", 1)
    return "tp" if tp > 1 and all(count % tp == 0 for count in head_counts) else None
