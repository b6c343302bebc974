"""Errors raised when a checkpoint does not fit what is asked of it."""


class CheckpointMismatchError(ValueError):
    """A checkpoint's tensors do not match the model: lists what is missing, extra or mis-shaped."""


class CheckpointError(ValueError):
    """A trainer checkpoint cannot be used: what is wrong with it, and what to do."""
