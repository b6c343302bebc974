"""The barrier the whole step puts before recomputation on the tpu device is torch_tpu's, and takes what titanpod
gives it: a list of tpu tensors in, the same shapes and dtypes out (traced on fake tensors; no chip here)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from titanpod.device.barriers import optimization_barrier


def test_the_tpu_devices_barrier_is_torch_tpus_and_passes_a_kept_value_with_a_gradient(tpu_backend):
    barrier = optimization_barrier(tpu_backend.device_type)
    assert barrier is torch.ops.tpu._optimization_barrier.default
    with FakeTensorMode():
        kept = torch.empty(2, 16, 64, dtype=torch.bfloat16, device="tpu")
        gradient = torch.empty(2, 16, 64, dtype=torch.float32, device="tpu")
        passed = barrier([kept, gradient])
    assert [(t.shape, t.dtype, t.device.type) for t in passed] == [
        (kept.shape, torch.bfloat16, "tpu"),
        (gradient.shape, torch.float32, "tpu"),
    ]
