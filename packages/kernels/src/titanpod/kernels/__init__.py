"""titanpod.kernels: JAX/Pallas functions as PyTorch ops, swapped into model slots.

``jax_op`` turns a JAX function into a traceable PyTorch op with autograd; the kernels
built on it (and their PyTorch references) fill ``titanpod.models.ModelOps`` slots.
"""

from titanpod.kernels.jax_op import JaxOp, jax_op

__all__ = ["JaxOp", "jax_op"]
