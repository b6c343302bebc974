"""``tools/bench/chip_profile.py`` off the chip: a small trace in the shape JAX writes for a TPU, summarised."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.bench_tools import load_bench


def _bench():
    return load_bench("chip_profile")


def _op(name: str, ts: float, dur: float, category: str, code: str = "", backward: bool = False, **args) -> dict:
    stack = f"/venv/site-packages/titanpod/kernels/pallas_costs.py:65:15\n/venv/site-packages/titanpod/{code}:3:9\n"
    tf_op = "jit(step)/transpose(jvp())/mul:" if backward else "jit(step)/jvp()/mul:"
    arguments = {"hlo_category": category, "source_stack": stack if code else "", "tf_op": tf_op, **args}
    return {"ph": "X", "pid": 3, "tid": 3, "ts": ts, "dur": dur, "name": name, "args": arguments}


def _trace(folder: Path) -> Path:
    """Two steps of 100 us each on a TPU's ops line: a loop holding a matmul, a Splash kernel, an elementwise op
    of the forward and one of the backward; a host line and Perfetto's own copy that must not be read."""
    events = [
        {"ph": "M", "pid": 3, "name": "process_name", "args": {"name": "/device:TPU:0"}},
        {"ph": "M", "pid": 3, "name": "process_sort_index", "args": {"sort_index": 3}},
        {"ph": "M", "pid": 3, "tid": 2, "name": "thread_name", "args": {"name": "XLA Modules"}},
        {"ph": "M", "pid": 3, "tid": 3, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 9, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "X", "pid": 9, "tid": 1, "ts": 0, "dur": 900, "name": "python"},
    ]
    for start in (0.0, 100.0):
        events.append({"ph": "X", "pid": 3, "tid": 2, "ts": start, "dur": 100, "name": "jit_step(123)"})
        events += [
            _op("while.1", start, 60, "while"),
            _op("fusion.7", start, 40, "convolution fusion", "models/common/feed_forward.py", model_flops=4e6),
            _op("splash_mqa_fwd_residuals.2", start + 40, 20, "custom-call", "kernels/pallas/splash_kernel.py"),
            _op("fusion.9", start + 60, 30, "loop fusion", "models/common/rope.py", bytes_accessed=3e6),
            _op("fusion.11", start + 90, 10, "loop fusion", "models/common/norms.py", backward=True),
        ]
    profile = folder / "profile" / "plugins" / "profile" / "2026_12_06"
    profile.mkdir(parents=True)
    for name in ("host.trace.json.gz", "perfetto_trace.json.gz"):
        with gzip.open(profile / name, "wt") as handle:
            json.dump({"traceEvents": events if name.startswith("host") else []}, handle)
    return profile / "host.trace.json.gz"


def test_a_trace_is_summarised_by_kind_and_by_code_line_each_loop_counted_once(tmp_path):
    bench = _bench()
    trace = _trace(tmp_path)
    assert bench.find_trace(tmp_path) == trace
    result = bench.summarize(trace, top=10)
    assert result["steps"] == 2 and result["step_ms"] == pytest.approx(0.1) and result["busy_ms"] == pytest.approx(0.1)
    kinds = {row["kind"]: row for row in result["kinds"]}
    assert set(kinds) == {"convolution fusion", "pallas: splash_mqa_fwd", "loop fusion"}  # not the loop itself
    assert kinds["convolution fusion"]["ms"] == pytest.approx(0.04) and kinds["convolution fusion"]["share"] == 0.4
    assert kinds["convolution fusion"]["tflop_per_s"] == pytest.approx(4e6 * 2 / 80e-6 / 1e12)
    assert kinds["loop fusion"]["gb_per_s"] == pytest.approx(3e6 * 2 / 80e-6 / 1e9)  # the rope and norm ops
    lines = [(row["pass"], row["code"], row["ms"]) for row in result["code_lines"]]
    assert lines == [
        ("forward", "titanpod/models/common/rope.py:3", pytest.approx(0.03)),
        ("backward", "titanpod/models/common/norms.py:3", pytest.approx(0.01)),
    ]
    assert result["top_ops"][0]["op"] == "fusion.7" and result["top_ops"][0]["calls"] == 1


def test_a_trace_without_a_tpu_is_refused_saying_what_to_run(tmp_path):
    bench = _bench()
    trace = tmp_path / "cpu.trace.json.gz"
    host = {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}}
    with gzip.open(trace, "wt") as handle:
        json.dump({"traceEvents": [host]}, handle)
    with pytest.raises(SystemExit, match="was the run on a TPU"):
        bench.summarize(trace)
    with pytest.raises(SystemExit, match="no such run folder or trace file"):
        bench.find_trace(tmp_path / "nothing")
    empty = tmp_path / "run"
    empty.mkdir()
    with pytest.raises(SystemExit, match=r"--profile\.steps"):
        bench.find_trace(empty)
    cut = tmp_path / "cut.trace.json.gz"
    cut.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "M"'))
    with pytest.raises(SystemExit, match="not a whole JSON trace"):
        bench.summarize(cut)
