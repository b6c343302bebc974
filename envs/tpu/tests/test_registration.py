"""The tpu device comes up through titanpod's backend with torch's autoload on and off.

Each case runs in a fresh interpreter: registering a device is for the life of a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, sys
import torch
loaded_by_torch = "torch_tpu._loader" in sys.modules
from titanpod.device import LaneUnavailableError
from titanpod.device.backends.tpu import TpuBackend, tpu_device_registered
try:
    TpuBackend()
    without_chips = "registered"
except LaneUnavailableError as error:
    without_chips = str(error)
sys.path.insert(0, sys.argv[1])
from conftest import pretend_chips_are_attached
pretend_chips_are_attached()
backend = TpuBackend()
from torch._dynamo.backends.registry import lookup_backend
lookup_backend(backend.compile_backend)  # raises where torch_tpu registered no compile backend
stats = backend.memory_stats()
print("PROBE " + json.dumps({
    "loaded_by_torch": loaded_by_torch,
    "without_chips": without_chips,
    "registered": tpu_device_registered(),
    "device": str(torch.device("tpu", 0)),
    "accelerator": str(torch.accelerator.current_accelerator()),
    "dist_backends": list(torch.distributed.Backend.backend_list),
    "memory_kind": stats.kind,
    "memory_peak": stats.peak_bytes,
    "memory_reason": stats.reason,
    "memory_limit": stats.limit_bytes,
}))
"""


def probe(autoload: str) -> dict:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": autoload}
    tests = os.path.dirname(__file__)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, tests], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("PROBE "))


@pytest.mark.parametrize("autoload", ["1", "0"])
def test_the_tpu_device_registers_with_autoload_on_and_off(autoload):
    found = probe(autoload)
    # With autoload on torch itself ran torch_tpu's loader at `import torch`; off, nothing did.
    assert found["loaded_by_torch"] is (autoload == "1")
    # Either way the loader registers nothing without chips, and the backend says so.
    assert "found no TPU chips" in found["without_chips"]
    # Once the PCI scan finds chips the backend's call to the loader registers the device.
    assert found["registered"] is True
    assert found["device"] == "tpu:0"
    assert found["accelerator"] == "tpu"
    assert "tpu" in found["dist_backends"]


def test_memory_statistics_come_from_torch_tpus_allocator():
    found = probe("0")
    # torch_tpu 0.2.0 answers torch.accelerator.memory (nothing allocated yet here); where a release
    # does not, the lane reports "unavailable" (tests/device/test_tpu_memory.py in the main suite).
    assert found["memory_kind"] == "device"
    assert found["memory_peak"] == 0
    assert found["memory_limit"] == 95 * 1024**3  # a v5p chip's HBM, from TPU_ACCELERATOR_TYPE
