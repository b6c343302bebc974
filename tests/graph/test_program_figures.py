"""Reading an optimised HLO module: collectives by kind, count and bytes, and while loops."""

from __future__ import annotations

from titanpod.graph.xla.program_figures import (
    DeviceMemory,
    array_bytes,
    collectives_in_hlo,
    count_while_loops,
    while_loop_sources,
)

HLO = """HloModule jit_step, is_scheduled=true

%all-reduce-scatter.3 (input.3: f32[768,256]) -> f32[768,64] {
  %input.3 = f32[768,256]{1,0:T(8,128)} parameter(0)
  %all-reduce.12 = f32[768,256]{1,0:T(8,128)} all-reduce(%input.3), channel_id=5, to_apply=%add
  ROOT %dynamic-slice.1 = f32[768,64]{1,0:T(8,128)} dynamic-slice(%all-reduce.12, %c, %d), dynamic_slice_sizes={768,64}
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  ROOT %t = (s32[], f32[8]{0}) tuple(%a, %b)
}

ENTRY %main.9 (Arg_0.1: bf16[64,256]) -> f32[] {
  %Arg_0.1 = bf16[64,256]{1,0:T(8,128)(2,1)} parameter(0)
  %all-gather.4 = bf16[256,256]{1,0:T(8,128)(2,1)} all-gather(%Arg_0.1), channel_id=1, dimensions={0}
  %all-gather-start = (bf16[64,256]{1,0}, bf16[256,256]{1,0}) all-gather-start(%Arg_0.1), channel_id=2
  %all-gather-done = bf16[256,256]{1,0} all-gather-done(%all-gather-start)
  %fusion.2 = f32[768,64]{1,0} fusion(%x), kind=kOutput, calls=%all-reduce-scatter.3
  %all-reduce.1 = (f32[], f32[4]{0}) all-reduce(%s, %v), channel_id=3, to_apply=%add
  %w = (s32[], f32[8]{0}) while(%i), condition=%c, body=%b, metadata={op_name="jit(step)/jit(searchsorted)/while"}
  ROOT %r = f32[] add(%u, %v)
}
"""


def test_collectives_by_kind_count_and_bytes() -> None:
    found = collectives_in_hlo(HLO)
    assert set(found) == {"all-gather", "all-reduce", "reduce-scatter"}
    # a synchronous gather and an asynchronous pair (counted once, by its done): 2 x 256 x 256 bf16
    assert found["all-gather"].count == 2
    assert found["all-gather"].bytes == 2 * 256 * 256 * 2
    # the TPU's reduce-scatter: an all-reduce of the whole buffer inside an all-reduce-scatter computation
    assert (found["reduce-scatter"].count, found["reduce-scatter"].bytes) == (1, 768 * 256 * 4)
    # a tuple's elements summed
    assert (found["all-reduce"].count, found["all-reduce"].bytes) == (1, 4 + 16)


def test_while_loops_are_counted() -> None:
    assert count_while_loops(HLO) == 1
    assert while_loop_sources(HLO) == ("jit(step)/jit(searchsorted)/while",)
    assert count_while_loops("ENTRY %m () -> f32[] {\n  ROOT %c = f32[] constant(0)\n}") == 0


def test_array_bytes() -> None:
    assert array_bytes("bf16[8,128]{1,0}") == 8 * 128 * 2
    assert array_bytes("(f32[], s32[3])") == 4 + 12
    assert array_bytes("pred[2,2]") == 4


def test_device_memory_total_counts_aliased_outputs_once() -> None:
    memory = DeviceMemory(arguments=100, outputs=60, aliased=50, temporaries=30, code=5)
    assert memory.total == 100 + 10 + 30 + 5
    assert memory.largest()[1] == 100
