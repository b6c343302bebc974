"""The xla lane's training step: the whole step as one ``jax.jit`` program, through torchax.

``build_step`` imports this package only on a single-controller backend (the xla lane); jax and
torchax are imported inside its functions, when a step is built, so importing it loads neither.

- ``step``: ``XlaStep``, the jitted step itself.
- ``state``: the parameters and optimizer state on the JAX devices: placing them, the state tree out and in.
- ``mesh``: the default mesh and the shardings of batches and replicated values.
- ``remat``: the memory policies as ``jax.checkpoint`` policies around each transformer block.
- ``precision``: torchax's bf16 autocast while the step is traced.
"""

from titanpod.graph.xla.step import XlaStep

__all__ = ["XlaStep"]
