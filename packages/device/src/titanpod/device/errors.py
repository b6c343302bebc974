"""Errors raised by the device shim."""


class LaneUnavailableError(RuntimeError):
    """A lane was asked for that cannot run on this machine.

    The message names what is missing and how to get it.
    """


class MeshError(ValueError):
    """A device mesh was described that cannot be built from the devices at hand."""
