"""What each lane is, as data, for code that plans a run without starting its backend (the dry run)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LaneTraits:
    """How a lane lays out processes, devices and parameters."""

    single_controller: bool
    """One process drives every device of its host and the compiler partitions the step (the xla lane);
    otherwise one process per device, sharding through torch.distributed."""
    device_memory_is_host: bool
    """The devices are the host's own memory (the cpu lane): nothing is held on the host beyond them."""
    supports_pipeline: bool
    """Pipeline stages are built on this lane (``parallel.pp`` above 1)."""


LANE_TRAITS: Mapping[str, LaneTraits] = {
    "cpu": LaneTraits(single_controller=False, device_memory_is_host=True, supports_pipeline=True),
    "cuda": LaneTraits(single_controller=False, device_memory_is_host=False, supports_pipeline=True),
    "xla": LaneTraits(single_controller=True, device_memory_is_host=False, supports_pipeline=False),
    "tpu": LaneTraits(single_controller=False, device_memory_is_host=False, supports_pipeline=True),
    "torch_xla": LaneTraits(single_controller=False, device_memory_is_host=False, supports_pipeline=False),
}
"""The traits of every lane in ``titanpod.device.lanes.LANES``."""


def lane_traits(lane: str) -> LaneTraits:
    """The traits of ``lane``; ``KeyError`` names the known lanes."""
    if lane not in LANE_TRAITS:
        raise KeyError(f"Unknown lane {lane!r}; lanes: {', '.join(LANE_TRAITS)}.")
    return LANE_TRAITS[lane]
