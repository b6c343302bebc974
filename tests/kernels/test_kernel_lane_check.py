"""A recipe whose attention the lane cannot compile as installed is refused before anything is built, naming
the field and the fix: torch_tpu's SDPA kernel under a libtpu older than 0.0.50 (what a v5e chip with libtpu
0.0.42.1 showed)."""

from __future__ import annotations

import pytest

from titanpod.device.backends import tpu
from titanpod.device.backends.cpu import CpuBackend
from titanpod.device.backends.tpu import TpuBackend
from titanpod.kernels import KernelConfig
from titanpod.kernels.lane_check import KernelNotOnLaneError, check_kernels_on_lane


@pytest.mark.parametrize("installed", ["0.0.42.1", "0.0.42", "0.0.49.dev20260101"])
def test_sdpa_on_the_tpu_lane_under_an_old_libtpu_is_refused_with_the_fix(monkeypatch, installed):
    monkeypatch.setattr(tpu, "installed_version", lambda name: installed if name == "libtpu" else None)
    with pytest.raises(KernelNotOnLaneError) as refused:
        check_kernels_on_lane(KernelConfig(attention="sdpa"), TpuBackend)
    message = str(refused.value)
    assert f"libtpu {installed} cannot compile" in message
    assert "0.0.50 or later" in message and "--kernels.attention math" in message
    for other in ("math", "splash", "splash_sdpa"):
        check_kernels_on_lane(KernelConfig(attention=other), TpuBackend)  # their kernels do not need it


@pytest.mark.parametrize("installed", ["0.0.50", "0.0.52", "0.1.0", None])
def test_sdpa_on_the_tpu_lane_under_a_new_or_no_libtpu_passes(monkeypatch, installed):
    monkeypatch.setattr(tpu, "installed_version", lambda name: installed)
    check_kernels_on_lane(KernelConfig(attention="sdpa"), TpuBackend)


def test_other_lanes_run_sdpa_whatever_libtpu_is_installed():
    check_kernels_on_lane(KernelConfig(attention="sdpa"), CpuBackend)
