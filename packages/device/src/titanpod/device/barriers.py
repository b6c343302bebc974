"""The optimization barrier a device's graph compiler honours, for recomputation that must stay recomputed.

A whole-step graph that recomputes a block's activations in the backward holds two copies of the same ops on the
same inputs. A compiler that eliminates common subexpressions merges them back into the forward's, and the
activations stay alive from forward to backward as if nothing were recomputed. XLA does this (torch_tpu's graphs
are compiled by XLA); an optimization barrier on the recomputation's inputs makes them values the compiler cannot
match, and orders the recomputation after whatever else the barrier is given.
"""

from __future__ import annotations

from typing import Any

import torch

TPU_BARRIER_DEVICE_TYPE = "tpu"
"""The device type whose compiler (XLA, through torch_tpu) merges duplicated ops and offers a barrier."""


def optimization_barrier(device_type: str) -> Any | None:
    """The op that passes a list of tensors through a barrier on ``device_type`` (``Tensor[] -> Tensor[]``), or
    ``None`` where the device's compiler needs none or offers none: torch_tpu's ``tpu::_optimization_barrier``
    (lowered to ``stablehlo.optimization_barrier``) once torch_tpu is loaded."""
    if device_type != TPU_BARRIER_DEVICE_TYPE:
        return None
    try:
        return torch.ops.tpu._optimization_barrier.default
    except (AttributeError, RuntimeError):  # torch_tpu not loaded: no such op
        return None
