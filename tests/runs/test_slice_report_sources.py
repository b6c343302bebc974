"""Where a slice compile's figures come from, as its report says: the compiler's cost analysis counts a loop's body
once, so a step of several micro-batches (one loop over them) has its flops and time counted for one of them."""

from __future__ import annotations

import dataclasses

from titanpod.graph.xla.ahead_of_time import BatchShape
from titanpod.graph.xla.program_figures import DeviceMemory, ProgramFigures
from titanpod.runs.slice_report import SliceCompileReport


def report(micro_batches: int, **fields) -> SliceCompileReport:
    memory = DeviceMemory(arguments=4, outputs=0, aliased=0, temporaries=8, code=1)
    program = ProgramFigures(memory=memory, flops=1e12, bytes_accessed=1e9, optimal_seconds=0.9)
    return SliceCompileReport(
        recipe="llama32_1b", slice="v5e-1", chips=1, chip_hbm=16 * 2**30, chip_peak_flops=197e12, mesh={},
        batch=BatchShape(micro_batches=micro_batches, batch=2, seq_len=4096), layers=16, model_layers=16,
        kernels={}, program=program, planner_bytes=13, model_flops_per_chip=1e12,
        tokens_per_step=micro_batches * 8192, trace_seconds=1.0, compile_seconds=1.0, peak_host_bytes=1, **fields,
    )  # fmt: skip


def test_a_step_of_one_micro_batch_names_only_its_compile():
    assert report(1).sources == {"memory": "a compile of 16 layers", "cost": "a compile of 16 layers"}


def test_a_step_of_several_micro_batches_says_its_cost_counts_one_of_them():
    once = "; its loop over the 8 micro-batches counted once, so low"
    scanned = report(8, scanned=True, cost_from=(2, 4))
    assert scanned.sources["memory"] == "a compile of 16 layers (blocks as one loop)"
    assert scanned.sources["cost"] == "extrapolated by depth from unrolled compiles of 2 and 4 layers" + once
    assert report(8).sources["cost"] == "a compile of 16 layers" + once
    extrapolated = dataclasses.replace(report(8), extrapolated_from=(2, 4))
    assert extrapolated.sources["memory"] == "extrapolated by depth from unrolled compiles of 2 and 4 layers"
    assert extrapolated.sources["cost"].endswith(once)
