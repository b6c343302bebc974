"""The chip tier: tests that need a TPU, run where one is attached, in one process (one program holds the chip).

    python3 -m pytest -m chip -p no:xdist tests/chip      # on a TPU VM (docs/tpu-chip.md: install, command)

Left out of the default run and of CI (``-m 'not slow and not chip'``) and skipped where no TPU is attached.
``TITANPOD_CHIP_TIER_ON_CPU=1`` runs the same tests with JAX on this machine's CPU (Pallas interpreted, small
shapes kept): a check of the tests themselves, not a result on a chip.
"""

from __future__ import annotations

import os

import pytest

from titanpod.device.probes import tpu_attached

ON_CPU = os.environ.get("TITANPOD_CHIP_TIER_ON_CPU") == "1"
"""The chip tier run on the CPU to check the tests themselves (nothing it measures is a chip's)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the chip tier where no TPU is attached (unless asked to check it on the CPU)."""
    if tpu_attached() or ON_CPU:
        return
    skip = pytest.mark.skip(reason="needs a TPU chip (the chip tier, docs/tpu-chip.md)")
    for item in items:
        if "chip" in item.keywords:
            item.add_marker(skip)
