"""The backend of the lane that runs: resolved by name, then constructed from its registered class."""

from __future__ import annotations

from titanpod.device.backend import Backend
from titanpod.device.lanes import resolve_lane
from titanpod.device.registry import LANE_REGISTRY, LaneRegistry


def get_backend(lane: str = "auto", registry: LaneRegistry = LANE_REGISTRY) -> Backend:
    """The backend of ``lane`` after resolution (config, then ``TITANPOD_LANE``, then automatic), constructed
    from its class in ``registry``; only that lane's module is imported.

    Raises ``LaneUnavailableError`` with the fix when the lane cannot run here.
    """
    return registry.backend_class(resolve_lane(lane, registry=registry))()
