"""A lane's compiled whole step says plainly when the device has no room for it (``titanpod.graph.device_full``).

The refusal below is the one libtpu 0.0.42.1 gave on a v5e when the tpu lane compiled Qwen 3 0.6B's whole step at
4 x 4,096 tokens (2026-12-06): torch.compile's backend error, the compiler's line inside it.
"""

from __future__ import annotations

import pytest
import torch

from titanpod.device import get_backend
from titanpod.device.memory import MemoryStats
from titanpod.graph import TrainConfig
from titanpod.graph.device_full import DoesNotFitDevice, SaysWhenDeviceFull, is_out_of_memory
from titanpod.graph.step_compiler import BackendStepCompiler

TPU_COMPILE_REFUSAL = RuntimeError(
    "backend='tpu' raised:\nRuntimeError: failed to compile MLIR module -- the XLA compiler failed with: ran out of "
    "memory on HBM, the total memory required for HLO temporaries (15.83G) exceeds available HBM (15.75G)\n\n"
    "While executing %submod_0 : [num_users=934] = call_module[target=submod_0](args = (%arg0_1, %arg1_1))"
)


class ChipBackend:
    """A backend whose device reports a v5e's capacity."""

    def memory_stats(self, local_rank: int = 0) -> MemoryStats:
        return MemoryStats(0, 0, int(15.75 * 1024**3), "device")


def refusing(error: Exception):
    def program(*args):
        raise error

    return program


def test_the_tpu_compilers_refusal_is_said_with_its_line_and_the_fixes():
    assert is_out_of_memory(TPU_COMPILE_REFUSAL)
    config = TrainConfig(step_mode="whole_step", memory_policy="recompute")
    step = SaysWhenDeviceFull(refusing(TPU_COMPILE_REFUSAL), ChipBackend(), config)
    with pytest.raises(DoesNotFitDevice) as refused:
        step(torch.ones(2))
    message = str(refused.value)
    assert "of the 15.75 GiB the device holds" in message
    assert "HLO temporaries (15.83G) exceeds available HBM (15.75G)" in message
    assert "submod_0" not in message and "backend='tpu' raised" not in message
    assert "data.batch-size" in message and "parallel.fsdp" in message and "--dry-run" in message
    assert isinstance(refused.value.__cause__, RuntimeError)


def test_other_errors_pass_unchanged_and_a_step_that_ran_is_called_straight_through():
    config = TrainConfig(step_mode="whole_step")
    other = ValueError("shapes do not match")
    with pytest.raises(ValueError, match="shapes do not match"):
        SaysWhenDeviceFull(refusing(other), ChipBackend(), config)(torch.ones(2))
    calls = []
    step = SaysWhenDeviceFull(lambda x: calls.append(x) or x * 2, ChipBackend(), config)
    assert torch.equal(step(torch.ones(2)), torch.full((2,), 2.0))
    assert torch.equal(step(torch.ones(1)), torch.full((1,), 2.0))
    assert len(calls) == 2


def test_the_lanes_own_compile_comes_back_wrapped():
    graph = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    compiler = BackendStepCompiler(get_backend("cpu"), TrainConfig(step_mode="whole_step"))
    program, report = compiler.compile(graph, ())
    assert isinstance(program, SaysWhenDeviceFull) and report is None
    assert torch.equal(program(torch.ones(1, 2)), graph(torch.ones(1, 2)))
