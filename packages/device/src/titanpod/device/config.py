"""The device part of a run's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LaneChoice = Literal["auto", "cpu", "cuda", "xla", "tpu", "torch_xla"]
"""What ``DeviceConfig.lane`` accepts: ``auto`` or one of ``titanpod.device.lanes.LANES``."""


@dataclass(frozen=True)
class DeviceConfig:
    """Where a run executes."""

    lane: LaneChoice = "auto"
    """``auto``, ``cpu``, ``cuda``, ``xla``, ``tpu`` or ``torch_xla``. Anything but ``auto``
    wins over the ``TITANPOD_LANE`` environment variable."""
    chip: str | None = None
    """Chip name for MFU (``v5p``, ``h100`` ...) when it cannot be detected; ``None`` detects it."""
