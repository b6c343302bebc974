"""Where a step's time goes on a TPU chip: the device's own op times from a run's ``jax.profiler`` trace, by kind
and by the line of model code each op came from.

    python tools/bench/chip_profile.py RUN_DIR_OR_TRACE [--top 25] [--json FILE]
    python tools/bench/chip_profile.py --train 'q06=--recipe qwen3_06b --data.source synthetic' --json FILE

With a run folder (one trained with ``--profile.steps`` on the xla lane) or a ``*.trace.json.gz`` it reads the
trace JAX writes beside its XProf trace (``<run>/profile/plugins/profile/<time>/<host>.trace.json.gz``); with
``--train NAME`` it first trains ``tools/bench/chip_step.py``'s configuration ``NAME`` (or ``NAME=FLAGS`` of
one's own) for ``--steps`` steps with the profiler on over ``--profile-steps``, in a process of its own.

Printed, per traced step: the time from the device's first op to its last; that time by kind (XProf's own
``hlo_category`` of each op: matmul fusions, the Pallas kernels by name, elementwise fusions, layout changes,
...; a loop or call counts through the ops inside it, not again as itself), with each kind's achieved TFLOP/s or
GB/s; the lines of titanpod's code (the innermost frame under ``titanpod/``) whose elementwise and layout ops
took longest, forward and backward apart; and the ``--top`` ops by time. A kind's share of the step is the most
that any change to it can gain.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

CONTAINERS = {"while", "call", "conditional"}
"""Categories of ops that run other ops: their time is their body's, counted there."""
MEMORY_BOUND = {"loop fusion", "data formatting", "non-fusion elementwise", "input fusion", "output fusion", "copy"}
"""Categories whose cost is bytes moved (the code lines table lists these)."""


def find_trace(path: Path) -> Path:
    """The newest JAX trace (``*.trace.json.gz``, not Perfetto's own ``perfetto_trace.json.gz``) at or under
    ``path``."""
    if not path.exists():
        raise SystemExit(f"{path}: no such run folder or trace file.")
    if path.is_file():
        return path
    traces = sorted(path.rglob("*.trace.json.gz"), key=lambda found: found.stat().st_mtime)
    traces = [trace for trace in traces if not trace.name.startswith("perfetto_trace")]
    if not traces:
        raise SystemExit(
            f"No *.trace.json.gz under {path}: train with --profile.steps FIRST-LAST on the xla lane "
            "(its jax.profiler trace goes to <run>/profile/), or give the trace file itself."
        )
    return traces[-1]


def load_events(trace: Path) -> list[dict]:
    """The trace's events (a Chrome/Perfetto JSON trace, gzipped or not)."""
    opener = gzip.open if trace.suffix == ".gz" else open
    try:
        with opener(trace, "rt") as handle:
            data = json.load(handle)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SystemExit(f"{trace} is not a whole JSON trace ({error}); a trace cut short is written again by "
                         "training with --profile.steps once more.") from error  # fmt: skip
    return data["traceEvents"] if isinstance(data, dict) else data


def device_events(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """The first TPU's complete events on its ``XLA Ops`` line and on its ``XLA Modules`` line."""
    names = {
        (e["pid"], e.get("tid")): e["args"].get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name")
    }
    tpus = sorted(pid for (pid, tid), name in names.items() if tid is None and name.startswith("/device:TPU"))
    if not tpus:
        return [], []
    lines: dict[str, list[dict]] = defaultdict(list)
    for event in events:
        if event.get("ph") == "X" and event.get("pid") == tpus[0]:
            lines[names.get((tpus[0], event.get("tid")), "")].append(event)
    return lines["XLA Ops"], lines["XLA Modules"]


def category_of(event: dict) -> str:
    """XProf's category of the op (``hlo_category``), else its name without the trailing number."""
    args = event.get("args") or {}
    return str(args.get("hlo_category") or re.sub(r"[.\d]+$", "", event["name"]))


def kind_of(event: dict) -> str:
    """The row of the kinds table an op counts in: its category, a Pallas kernel by its name."""
    category = category_of(event)
    if category != "custom-call":
        return category
    name = event["name"]
    if name.startswith("splash_"):
        return "pallas: " + "_".join(name.split("_")[:3]).rstrip(".0123456789")
    code = code_line(event)
    return f"pallas: {Path(code.split(':')[0]).stem}" if code else "custom call"


WRAPPERS = ("titanpod/kernels/jax_custom_op.py", "titanpod/kernels/pallas_costs.py")
"""Modules that wrap every kernel call: a frame in them says nothing of which kernel or which model line."""


def code_line(event: dict) -> str:
    """The innermost frame of titanpod's own code (kernel wrappers passed over) that made the op
    (``titanpod/package/module.py:line``), else ''."""
    stack = str((event.get("args") or {}).get("source_stack", "")).splitlines()
    for frame in stack:
        if "/titanpod/" in frame and not any(wrapper in frame for wrapper in WRAPPERS):
            _, _, rest = frame.partition("/titanpod/")
            return "titanpod/" + rest.rsplit(":", 1)[0]
    return ""


def is_backward(event: dict) -> bool:
    """Whether the op belongs to the backward (JAX's ``transpose`` of the forward, recomputation included)."""
    return "transpose(" in str((event.get("args") or {}).get("tf_op", ""))


def summarize(trace: Path, top: int = 25) -> dict:
    """The traced steps' time by kind, by code line and by op, from ``trace``."""
    ops, modules = device_events(load_events(trace))
    if not ops:
        raise SystemExit(f"{trace} has no TPU op events (an 'XLA Ops' line of a /device:TPU): was the run on a TPU?")
    counted = [e for e in ops if category_of(e) not in CONTAINERS]
    steps = _steps(modules)
    start = min(e["ts"] for e in ops)
    wall = (max(e["ts"] + e.get("dur", 0) for e in ops) - start) / steps
    kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # microseconds, flops, bytes
    lines: dict[tuple[str, str, str], float] = defaultdict(float)
    by_op: dict[str, list[Any]] = defaultdict(lambda: [0.0, 0, "", ""])
    for event in counted:
        duration, args = event.get("dur", 0.0), event.get("args") or {}
        figures = kinds[kind_of(event)]
        figures[0] += duration
        figures[1] += float(args.get("model_flops") or 0)
        figures[2] += float(args.get("bytes_accessed") or 0)
        if category_of(event) in MEMORY_BOUND:
            lines[("backward" if is_backward(event) else "forward", category_of(event), code_line(event))] += duration
        entry = by_op[event["name"]]
        entry[0] += duration
        entry[1] += 1
        entry[2] = entry[2] or code_line(event) or str(args.get("tf_op", ""))[-60:]
        entry[3] = kind_of(event)
    busy = sum(e.get("dur", 0.0) for e in counted) / steps
    return {
        "trace": str(trace),
        "steps": steps,
        "step_ms": wall / 1000,
        "busy_ms": busy / 1000,
        "kinds": [
            {
                "kind": kind,
                "ms": time / steps / 1000,
                "share": time / steps / wall,
                "tflop_per_s": flops / time / 1e6 if time else 0.0,
                "gb_per_s": moved / time / 1e3 if time else 0.0,
            }
            for kind, (time, flops, moved) in sorted(kinds.items(), key=lambda item: -item[1][0])
        ],
        "code_lines": [
            {
                "pass": part,
                "category": category,
                "code": code or "(no titanpod frame)",
                "ms": time / steps / 1000,
                "share": time / steps / wall,
            }
            for (part, category, code), time in sorted(lines.items(), key=lambda item: -item[1])[:top]
        ],
        "top_ops": [
            {"op": op, "kind": kind, "ms": time / steps / 1000, "calls": calls / steps, "where": where}
            for op, (time, calls, where, kind) in sorted(by_op.items(), key=lambda item: -item[1][0])[:top]
        ],
    }


def _steps(modules: list[dict]) -> int:
    """How many steps the trace holds: the launches of its most launched program (the step's own, ``jit_step``,
    where one has that name)."""
    counts: dict[str, int] = defaultdict(int)
    for event in modules:
        counts[event["name"].split("(")[0]] += 1
    return counts.get("jit_step") or max(counts.values(), default=1)


def print_summary(result: dict) -> None:
    """The summary as three tables."""
    step, busy = result["step_ms"], result["busy_ms"]
    print(f"trace: {result['trace']}")
    print(f"{result['steps']} step(s) traced: {step:.1f} ms a step from the first op to the last; ops {busy:.1f} ms")
    print(f"\n{'kind':<34} {'ms/step':>8} {'share':>6} {'TFLOP/s':>8} {'GB/s':>6}")
    for row in result["kinds"]:
        print(f"{row['kind'][:34]:<34} {row['ms']:>8.1f} {row['share']:>6.1%} {row['tflop_per_s']:>8.1f} "
              f"{row['gb_per_s']:>6.0f}")  # fmt: skip
    print(f"\nelementwise and layout ops by the line that made them\n{'pass':<9} {'category':<24} {'ms/step':>8} "
          f"{'share':>6}  code")  # fmt: skip
    for row in result["code_lines"]:
        print(f"{row['pass']:<9} {row['category'][:24]:<24} {row['ms']:>8.1f} {row['share']:>6.1%}  {row['code']}")
    print(f"\n{'op':<40} {'kind':<26} {'ms/step':>8} {'calls':>6}  where")
    for row in result["top_ops"]:
        print(f"{row['op'][:40]:<40} {row['kind'][:26]:<26} {row['ms']:>8.2f} {row['calls']:>6.1f}  {row['where']}")


def train_and_find_trace(name: str, steps: int, profile_steps: str, runs_dir: Path) -> Path:
    """Train chip_step's configuration ``name`` (or ``NAME=FLAGS``) with the profiler on; its run folder."""
    import chip_step

    table = dict(chip_step.CONFIGURATIONS)
    if "=" in name:
        name, flags = name.split("=", 1)
        table[name] = flags
    if name not in table:
        raise SystemExit(f"--train {name}: not a configuration of chip_step.py ({', '.join(table)}); "
                         "give NAME=FLAGS for one of your own.")  # fmt: skip
    flags = [*chip_step.flags_of(name, table), "--profile.steps", profile_steps]
    result = chip_step.measure(name, flags, steps, runs_dir, runs_dir / "logs")
    if "error" in result:
        raise SystemExit(f"the profiled run failed: {result['error']}")
    tokens, mfu = result["tokens_per_second"], result["mfu"]
    print(f"trained {name}: {tokens:,.0f} tokens/s, MFU {mfu:.1%} (the traced steps included)")
    return runs_dir / name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", type=Path, help="a run folder trained with --profile.steps, or a trace")
    parser.add_argument("--train", help="chip_step.py's configuration NAME (or NAME=FLAGS) to train and profile")
    parser.add_argument("--steps", type=int, default=8, help="steps to train with --train")
    parser.add_argument("--profile-steps", default="6-7", help="the steps to trace with --train")
    parser.add_argument("--runs-dir", type=Path, default=None, help="where --train's run goes (a temporary folder)")
    parser.add_argument("--top", type=int, default=25, help="how many code lines and ops to list")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    if (args.path is None) == (args.train is None):
        parser.error("give a run folder or trace, or --train NAME")
    path = args.path
    if args.train:
        runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="chip_profile_"))
        path = train_and_find_trace(args.train, args.steps, args.profile_steps, runs_dir)
    result = summarize(find_trace(path), args.top)
    print_summary(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
