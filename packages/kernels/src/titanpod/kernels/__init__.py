"""titanpod.kernels: JAX/Pallas functions as PyTorch ops, swapped into model slots.

Nothing here yet: the ``jax_op`` bridge and the kernels arrive with the kernels work; until
then models run their PyTorch reference ops (``titanpod.models.ModelOps``).
"""
