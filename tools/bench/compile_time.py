"""The whole step's first call with empty caches (a cold compile) and in the run after it, against inductor's own way.

    uv run python tools/bench/compile_time.py [--model anchors|debug|100m] [--repeats 2]

Each measurement is a fresh process with its own empty compiled-step and inductor caches
(``XDG_CACHE_HOME`` and ``TORCHINDUCTOR_CACHE_DIR`` in a new temporary folder): it builds the
model and its whole step (``tools/bench/step_modes_alternating.py``'s shapes) and times the first
call, which captures and compiles the step; a second process with the same folders then times
its first call, which loads the step the first one saved. Two ways take turns, ``--repeats``
times each:

- ``titanpod``: the step as ``titanpod.graph`` compiles it;
- ``inductor-defaults``: the same step with what ``titanpod.graph`` adds to a cold compile undone
  (inductor's default settings instead of ``compiled_steps.CPU_OPTIONS``, kernels built after code
  generation, and a first process that waits for every vector-instruction check before capturing).

Printed per way: the first call of each run (median over repeats, seconds), the compile alone
as the step reports it, the C++ kernels inductor generated, the median of 4 later steps, and the
cold first call's ratio to ``inductor-defaults``. Inductor's precompiled header lives outside its
cache folder (under the system's temporary folder), so it is built once per machine and reused
by every measurement here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WAYS = ("titanpod", "inductor-defaults")


def _undo_titanpod_compile_settings() -> None:
    """Put back what a cold compile did before ``titanpod.graph``'s changes to it (the baseline way)."""
    import contextlib

    from titanpod.graph import compiled_steps, steps, vector_isa

    compiled_steps.CPU_OPTIONS = {}
    compiled_steps.kernels_built_as_generated = contextlib.nullcontext
    vector_isa._best_candidate_builds = lambda: False
    steps.WholeStep._shortcut_possible = lambda self: self._cache_dir is not None


def _one(model_name: str, way: str) -> dict:
    """One process's first call and later steps (run in a child process)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from step_modes import MODELS
    from step_modes_alternating import ANCHORS, _build

    if way == "inductor-defaults":
        _undo_titanpod_compile_settings()
    spec = ANCHORS if model_name == "anchors" else MODELS[model_name]
    model, step = _build(spec, "whole_step")
    generator = torch.Generator().manual_seed(0)

    def timed() -> float:
        tokens = torch.randint(0, model.args.vocab_size, (spec["batch"], spec["seq"] + 1), generator=generator)
        started = time.perf_counter()
        float(step([(tokens[:, :-1], tokens[:, 1:])], 8e-4).loss)
        return time.perf_counter() - started

    first = timed()
    report = step.compile_report
    later = statistics.median(timed() for _ in range(4))
    folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    kernels = None
    if report is not None and report.cache != "hit":  # a compile wrote its module; the largest is the step's
        module = max(folder.rglob("*.py"), key=lambda path: path.stat().st_size)
        kernels = module.read_text().count("= async_compile.cpp_pybinding")
    return {
        "first": first,
        "compile": report.seconds if report else None,
        "cache": report.cache if report else None,
        "later": later,
        "kernels": kernels,
    }


def _measure(model_name: str, way: str, folder: str) -> dict:
    env = {
        **os.environ,
        "XDG_CACHE_HOME": f"{folder}/xdg",
        "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
    }
    done = subprocess.run(
        [sys.executable, __file__, "--one", model_name, way], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{way} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="anchors", choices=["anchors", "debug", "100m"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "WAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(*args.one)))
        return
    results: dict[str, list[tuple[dict, dict]]] = {way: [] for way in WAYS}
    for repeat in range(args.repeats):
        for way in WAYS:
            with tempfile.TemporaryDirectory(prefix="titanpod-compile-time-") as folder:
                cold = _measure(args.model, way, folder)
                second = _measure(args.model, way, folder)
            results[way].append((cold, second))
            print(
                f"repeat {repeat + 1}/{args.repeats} {way}: cold first call {cold['first']:.1f} s "
                f"(compile {cold['compile']:.1f} s), second run {second['first']:.1f} s ({second['cache']})",
                file=sys.stderr,
                flush=True,
            )
    baseline = statistics.median(cold["first"] for cold, _ in results["inductor-defaults"])
    print(f"\n{args.model}: whole step, fp32, {args.repeats} repeats (medians)")
    print("| way | cold first call (s) | of it, compile (s) | C++ kernels | second run's first call (s) "
          "| later step (s) | cold vs inductor-defaults |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for way, pairs in results.items():
        cold_first = statistics.median(cold["first"] for cold, _ in pairs)
        compile_seconds = statistics.median(cold["compile"] for cold, _ in pairs)
        second_first = statistics.median(second["first"] for _, second in pairs)
        later = statistics.median(cold["later"] for cold, _ in pairs)
        kernels = pairs[0][0]["kernels"]
        print(
            f"| {way} | {cold_first:.1f} | {compile_seconds:.1f} | {kernels} | {second_first:.1f} | {later:.3f} "
            f"| {baseline / cold_first:.2f} |"
        )


if __name__ == "__main__":
    main()
