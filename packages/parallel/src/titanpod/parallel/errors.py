"""Errors raised when a parallel layout cannot be applied."""


class PlanError(ValueError):
    """A sharding plan does not fit the model or the mesh; the message names the parameter and the fix."""
