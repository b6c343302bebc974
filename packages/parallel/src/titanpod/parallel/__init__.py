"""titanpod.parallel: declarative sharding plans and their DTensor and XLA SPMD appliers.

Nothing here yet: plans for the model families arrive with the parallelism work.
"""
