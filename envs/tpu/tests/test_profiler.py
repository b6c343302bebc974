"""The tpu lane's profiler: torch.profiler with torch_tpu's public TpuProfilerConfig, as titanpod builds it.

A chip-less host cannot record a device trace, so this checks the call itself: torch_tpu offers the option
under ``torch.tpu.profiler`` and ``torch.profiler.profile`` takes it with the run's folder and rank.
"""

from __future__ import annotations

import torch

from titanpod.graph import ProfileConfig
from titanpod.graph.profiling import TorchTrace, lane_trace


def test_the_tpu_lane_traces_with_torch_tpus_profiler_config(tpu_backend, tmp_path):
    trace = lane_trace(ProfileConfig("1"), tmp_path, 3, tpu_backend.lane)
    assert isinstance(trace, TorchTrace)
    config = trace._profiler.experimental_config
    assert isinstance(config, torch.tpu.profiler.TpuProfilerConfig)
    assert isinstance(config, torch.profiler._ExperimentalConfig)
