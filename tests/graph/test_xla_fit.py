"""The xla step says plainly what does not fit its device, naming the room taken and the fix.

Units: the moments' check against a device's reported capacity, and the allocator's refusal said with the
program's figures. End to end (a subprocess with 8 host devices): the llama3 debug step on a backend whose
memory statistics say the device holds less than its AdamW moments (refused before they are made); on one
that holds enough, the step runs and records its compiled program's bytes; an allocator refusal as the
program starts comes out as ``DoesNotFitDevice`` with those figures.
"""

from __future__ import annotations

import pytest

from tests.conftest import XLA_ENV, run_json_script
from titanpod.device.memory import MemoryStats
from titanpod.graph import TrainConfig
from titanpod.graph.device_full import DoesNotFitDevice, is_out_of_memory, out_of_device_memory
from titanpod.graph.xla.fit import check_state_fits
from titanpod.graph.xla.program_figures import DeviceMemory

GIB = 1024**3


def device(limit_gib: float, used_gib: float = 0.0, kind: str = "device") -> MemoryStats:
    return MemoryStats(int(used_gib * GIB), int(used_gib * GIB), int(limit_gib * GIB), kind)


def test_moments_that_do_not_fit_what_is_free_are_refused_with_the_figures():
    check_state_fits(int(2 * GIB), device(16, used_gib=2.5))  # 4 GiB of moments in 13.5 free
    with pytest.raises(DoesNotFitDevice) as refused:
        check_state_fits(int(5 * GIB), device(16, used_gib=10))  # 10 GiB of moments in 6 free
    message = str(refused.value)
    assert "5.00 GiB" in message and "10.00 GiB more" in message and "6.00 GiB of 16.00 GiB free" in message
    assert "parallel.fsdp" in message and "Nothing has run" in message


ALLOCATOR = RuntimeError(
    "RESOURCE_EXHAUSTED: Error loading program: Attempting to reserve 9.80G at the bottom of memory. "
    "That was not possible. There are 9.09G free.\nmore detail"
)


def test_an_allocator_refusal_is_said_with_the_programs_figures_and_the_fixes():
    memory = DeviceMemory(arguments=int(7 * GIB), outputs=int(7 * GIB), aliased=int(7 * GIB),
                          temporaries=int(12 * GIB), code=0)  # fmt: skip
    assert is_out_of_memory(ALLOCATOR) and not is_out_of_memory(RuntimeError("INVALID_ARGUMENT: shapes"))
    config = TrainConfig(step_mode="whole_step", memory_policy="selective")
    message = str(out_of_device_memory(ALLOCATOR, memory, device(15.75), config))
    assert "of the 15.75 GiB the device holds" in message and "Attempting to reserve 9.80G" in message
    assert "more detail" not in message  # the allocator's first line, not its dump
    assert "19.00 GiB a device" in message and "temporaries (activations" in message
    assert "--train.memory-policy recompute (now selective" in message and "data.batch-size" in message
    assert "--dry-run --target.chip" in message
    recompute = TrainConfig(step_mode="whole_step", memory_policy="recompute")
    assert "memory-policy" not in str(out_of_device_memory(ALLOCATOR, None, device(15.75), recompute))


def test_no_check_where_the_lane_reports_no_device_memory():
    check_state_fits(10**15, device(1, kind="host"))  # JAX on the CPU: host figures, no capacity
    check_state_fits(10**15, MemoryStats(None, None, None, "unavailable", "no statistics"))


SCRIPT = """
import json, torch
from titanpod.device import get_backend
from titanpod.device.memory import MemoryStats
from titanpod.graph import TrainConfig
from titanpod.graph.xla import XlaStep
from titanpod.graph.device_full import DoesNotFitDevice
from titanpod.recipes.families import build_model

backend = get_backend("xla")
def as_a_device_of(limit):
    def stats(local_rank=0):
        return MemoryStats(0, 0, limit, "device")
    return stats

def attempt(limit):
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(0)
    backend.memory_stats = as_a_device_of(limit)
    config = TrainConfig(steps=2, warmup_steps=1, step_mode="whole_step")
    try:
        step = XlaStep(model, config, backend)
    except DoesNotFitDevice as refused:
        return {"at": "state", "message": str(refused)}
    data = torch.randint(0, 2048, (2, 33))
    step([(data[:, :-1], data[:, 1:])], 1e-3)
    figures = {"at": "ran", "program": step.program_figures.memory.total}

    class Refusing:  # the compiled program, as a device without room for it answers
        def __call__(self, *arguments):
            raise RuntimeError("RESOURCE_EXHAUSTED: Attempting to reserve 9.80G. That was not possible.")

    step._compiled = {key: Refusing() for key in step._compiled}
    try:
        step([(data[:, :-1], data[:, 1:])], 1e-3)
    except DoesNotFitDevice as refused:
        figures["refused"] = str(refused)
    return figures

parameters = sum(p.numel() for p in build_model("llama3", "debug", device="meta").parameters()) * 4
result = {"parameters": parameters, "tiny": attempt(parameters), "roomy": attempt(64 * 1024**3)}
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def attempts() -> dict:
    return run_json_script(SCRIPT, env=XLA_ENV)


def test_the_step_refuses_moments_that_would_not_fit_before_making_them(attempts):
    assert attempts["tiny"]["at"] == "state"
    assert "AdamW's two moments" in attempts["tiny"]["message"]


def test_a_step_that_fits_runs_and_reports_its_program_bytes(attempts):
    assert attempts["roomy"]["at"] == "ran"
    assert attempts["roomy"]["program"] > attempts["parameters"] * 3  # parameters, moments and temporaries


def test_an_allocator_refusal_as_the_program_starts_is_said_with_its_figures(attempts):
    refused = attempts["roomy"]["refused"]
    assert "no room for the training step of the 64.00 GiB the device holds" in refused
    assert "The compiler counts" in refused and "Attempting to reserve 9.80G" in refused
