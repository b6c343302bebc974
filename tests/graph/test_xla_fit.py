"""The xla step refuses, before anything runs, what does not fit its device, naming the room taken and the fix.

Units: the two checks against a device's reported capacity. End to end (a subprocess with 8 host devices):
the llama3 debug step on a backend whose memory statistics say the device holds less than the step needs:
first less than its AdamW moments (refused before they are made), then more than the state but less than
the compiled program (refused after the compile, before the first step runs).
"""

from __future__ import annotations

import pytest

from tests.conftest import XLA_ENV, run_json_script
from titanpod.device.memory import MemoryStats
from titanpod.graph import TrainConfig
from titanpod.graph.xla.fit import DoesNotFitDevice, check_program_fits, check_state_fits
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


def test_a_program_over_the_capacity_is_refused_naming_its_largest_part_and_the_fixes():
    memory = DeviceMemory(arguments=int(7 * GIB), outputs=int(7 * GIB), aliased=int(7 * GIB),
                          temporaries=int(12 * GIB), code=0)  # fmt: skip
    check_program_fits(memory, device(20), TrainConfig(step_mode="whole_step", memory_policy="selective"))
    with pytest.raises(DoesNotFitDevice) as refused:
        check_program_fits(memory, device(15.75), TrainConfig(step_mode="whole_step", memory_policy="selective"))
    message = str(refused.value)
    assert "19.00 GiB a device" in message and "15.75 GiB" in message
    assert "temporaries (activations" in message and "12.00 GiB" in message
    assert "--train.memory-policy recompute (now selective" in message and "data.batch-size" in message
    with pytest.raises(DoesNotFitDevice) as refused:
        check_program_fits(memory, device(15.75), TrainConfig(step_mode="whole_step", memory_policy="recompute"))
    assert "memory-policy" not in str(refused.value)  # already the policy that keeps least


def test_no_check_where_the_lane_reports_no_device_memory():
    huge = DeviceMemory(arguments=10**15, outputs=0, aliased=0, temporaries=10**15, code=0)
    check_program_fits(huge, device(1, kind="host"), TrainConfig())  # JAX on the CPU: host figures, no capacity
    check_state_fits(10**15, MemoryStats(None, None, None, "unavailable", "no statistics"))


SCRIPT = """
import json, torch
from titanpod.device import get_backend
from titanpod.device.memory import MemoryStats
from titanpod.graph import TrainConfig
from titanpod.graph.xla import XlaStep
from titanpod.graph.xla.fit import DoesNotFitDevice
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
    before = [array.copy() for array in step.jax_params[:1]]
    try:
        step([(data[:, :-1], data[:, 1:])], 1e-3)
    except DoesNotFitDevice as refused:
        unchanged = bool((before[0] == step.jax_params[0]).all())
        return {"at": "program", "message": str(refused), "unchanged": unchanged, "compiled": step.compiled_programs,
                "program": step.program_figures.memory.total}
    return {"at": "ran", "program": step.program_figures.memory.total}

parameters = sum(p.numel() for p in build_model("llama3", "debug", device="meta").parameters()) * 4
result = {"parameters": parameters, "tiny": attempt(parameters), "state_only": attempt(parameters * 3 + 4096),
          "roomy": attempt(64 * 1024**3)}
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def attempts() -> dict:
    return run_json_script(SCRIPT, env=XLA_ENV)


def test_the_step_refuses_moments_that_would_not_fit_before_making_them(attempts):
    assert attempts["tiny"]["at"] == "state"
    assert "AdamW's two moments" in attempts["tiny"]["message"]


def test_the_step_refuses_a_program_that_would_not_fit_before_it_runs(attempts):
    refused = attempts["state_only"]
    assert refused["at"] == "program" and "as the compiler counts it" in refused["message"]
    assert refused["unchanged"] and refused["compiled"] == 0  # refused before running, and not kept
    assert refused["program"] > attempts["parameters"] * 3  # parameters, moments and the step's temporaries


def test_a_step_that_fits_runs_and_reports_its_program_bytes(attempts):
    assert attempts["roomy"]["at"] == "ran"
    assert attempts["roomy"]["program"] == attempts["state_only"]["program"]
