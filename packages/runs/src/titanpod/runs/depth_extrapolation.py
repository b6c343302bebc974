"""A program's figures by depth: the whole model's from compiles of two shallow unrolled copies (identical layers
make every figure linear in depth), and a scanned compile's flops, bytes, time and collectives taken from them
(the compiler's cost analysis counts a loop's body once)."""

from __future__ import annotations

import dataclasses

from titanpod.graph.xla.program_figures import Collective, DeviceMemory, ProgramFigures
from titanpod.runs.slice_report import SliceCompileReport

COST_DEPTHS = (2, 4)
"""The depths of the unrolled copies whose compiles give a scanned program's flops, time and collectives."""


def with_costs_from(
    full: SliceCompileReport, shallow: SliceCompileReport, deeper: SliceCompileReport
) -> SliceCompileReport:
    """``full`` (a scanned compile of the whole depth) with its flops, bytes, estimated time and collectives
    replaced by those ``extrapolated`` from two unrolled compiles of shallow copies; memory, loops and compile
    time stay ``full``'s own."""
    cost = extrapolated(shallow, deeper).program
    program = dataclasses.replace(
        cost, memory=full.program.memory, while_loops=full.program.while_loops, loop_sources=full.program.loop_sources
    )
    return dataclasses.replace(
        full,
        program=program,
        cost_from=(shallow.layers, deeper.layers),
        cost_compile_seconds=shallow.compile_seconds
        + shallow.trace_seconds
        + deeper.compile_seconds
        + deeper.trace_seconds,
        peak_host_bytes=max(full.peak_host_bytes, shallow.peak_host_bytes, deeper.peak_host_bytes),
    )


def extrapolated(shallow: SliceCompileReport, deeper: SliceCompileReport) -> SliceCompileReport:
    """The full model's figures from two compiles of shallow copies (``deeper`` with more layers): every memory
    part, flop, byte, second and collective grows linearly with depth, as identical layers make it. Compile time
    and host memory are the two compiles' own (summed, and the larger)."""
    if deeper.layers <= shallow.layers:
        raise ValueError("Extrapolating by depth needs two compiles of different depths, the second deeper.")
    depth = shallow.model_layers
    scale = (depth - shallow.layers) / (deeper.layers - shallow.layers)

    def grow(low: float, high: float) -> float:
        return low + (high - low) * scale

    a, b = shallow.program, deeper.program
    memory = DeviceMemory(*(round(grow(getattr(a.memory, f.name), getattr(b.memory, f.name)))
                            for f in dataclasses.fields(DeviceMemory)))  # fmt: skip
    collectives = {
        kind: Collective(
            round(grow(a.collectives.get(kind, Collective(0, 0)).count, b.collectives[kind].count)),
            round(grow(a.collectives.get(kind, Collective(0, 0)).bytes, b.collectives[kind].bytes)),
        )
        for kind in b.collectives
    }
    seconds = (
        None if a.optimal_seconds is None or b.optimal_seconds is None else grow(a.optimal_seconds, b.optimal_seconds)
    )
    program = ProgramFigures(
        memory, grow(a.flops, b.flops), grow(a.bytes_accessed, b.bytes_accessed), seconds, collectives,
        b.while_loops, b.loop_sources,
    )  # fmt: skip
    return dataclasses.replace(
        deeper,
        layers=depth,
        program=program,
        model_flops_per_chip=grow(shallow.model_flops_per_chip, deeper.model_flops_per_chip),
        planner_bytes=round(grow(shallow.planner_bytes, deeper.planner_bytes)),
        trace_seconds=shallow.trace_seconds + deeper.trace_seconds,
        compile_seconds=shallow.compile_seconds + deeper.compile_seconds,
        peak_host_bytes=max(shallow.peak_host_bytes, deeper.peak_host_bytes),
        extrapolated_from=(shallow.layers, deeper.layers),
    )
