"""Fixtures: vLLM's TPU build, imported once on a machine without a TPU.

Importing it picks tpu-inference's platform (``TpuPlatform``) whether or not a chip is present; it logs that it
cannot reach the TPU VM's metadata server and finds no device name, and goes on.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vllm():
    """The installed ``vllm`` package (vllm-tpu), with ``LLM`` and ``SamplingParams`` imported."""
    import vllm

    assert vllm.LLM and vllm.SamplingParams
    return vllm


@pytest.fixture(scope="session")
def tpu_worker(vllm):
    """tpu-inference's worker class, which vLLM's TPU platform runs."""
    from tpu_inference.worker.tpu_worker import TPUWorker

    return TPUWorker
