"""The xla lane's training step: the whole step as one ``jax.jit`` program, through torchax.

``build_step`` imports this package only on a single-controller backend (the xla lane); jax and
torchax are imported inside its functions, when a step is built, so importing it loads neither.

- ``step``: ``XlaStep``, the jitted step itself: built, compiled once per batch shape, called.
- ``step_program``: the optimizer and the whole step as JAX functions, and the step's ``jax.jit``.
- ``loss``: the model's loss as a JAX function, through torchax.
- ``gather``: FSDP's gather of each block's parameters, and the hidden states' layout, as sharding constraints.
- ``held_out``: the forward-only program of the held-out loss.
- ``batches``: a step's micro-batches stacked and placed on the mesh.
- ``state``: the parameters and optimizer state on the JAX devices: placing them, the state tree out and in.
- ``state_step``: the step's state interface: ``state_dict``, ``load_state_dict`` and ``finish``.
- ``moment_pieces``: AdamW's moments in host memory, each tensor's held as pieces along its first axis.
- ``mesh``: the default mesh and the shardings of batches and replicated values.
- ``remat``: the memory policies as ``jax.checkpoint`` policies around each transformer block.
- ``precision``: torchax's bf16 autocast while the step is traced.
"""

from titanpod.graph.xla.step import XlaStep

__all__ = ["XlaStep"]
