"""What the planner asks of a lane, read from its backend class's traits (``titanpod.device.backend_class``), never
from its name, so a lane added later is planned by the traits it sets."""

from __future__ import annotations

from titanpod.device import LANE_REGISTRY, LaneRegistry, backend_class


def runs_one_jitted_program(lane: str, registry: LaneRegistry = LANE_REGISTRY) -> bool:
    """Whether ``lane``'s training step is one program that XLA compiles and partitions over every device: the
    step ``titanpod.graph`` builds on a ``single_controller`` lane (``XlaStep``, the whole step under ``jax.jit``
    through torchax; the xla lane). The planner gives that step libtpu's figures: matmul outputs in fp32 and bf16
    weight copies (``compiled_step.py``), hidden states whole over tp, the vocabulary gradients whole on an ep mesh
    (``plan.py``) and the reference attention's score matrices (``flux.py``)."""
    return backend_class(lane, registry).single_controller
