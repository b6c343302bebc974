"""The whole step's first call with empty caches (a cold start) and in the run after it, for each step compiler.

    uv run python tools/bench/compile_time.py [--model anchors|debug|100m] [--repeats 2]

Each measurement is a fresh process with its own empty compiled-step and inductor caches
(``XDG_CACHE_HOME`` and ``TORCHINDUCTOR_CACHE_DIR`` in a new temporary folder): it builds the
model and its whole step (``tools/bench/step_modes_alternating.py``'s shapes) and times the first
call, which captures and compiles the step; a second process with the same folders then times
its first call, a warm start. The two ``train.step_compiler`` choices take turns, ``--repeats``
times each:

- ``inductor`` (the default): ``torch.compile`` of the captured step, with inductor's own caches;
- ``cached``: titanpod's compiled-step cache (``titanpod.graph.cpu_compile``): the step compiled by
  ``standalone_compile`` with titanpod's CPU settings, C++ kernels built as they are generated,
  and a warm start that loads the step under its fingerprint without capturing it.

Printed per way: the first call of each run (median over repeats, seconds), the compile alone
where the step reports it (``cached``), the C++ kernels inductor generated, the median of 4
later steps, and each figure's ratio to ``inductor`` measured in the same run. Inductor's
precompiled header lives outside its cache folder (under the system's temporary folder), so it
is built once per machine and reused by every measurement here.
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

WAYS = ("inductor", "cached")


def _one(model_name: str, way: str) -> dict:
    """One process's first call and later steps (run in a child process)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from step_modes import MODELS
    from step_modes_alternating import ANCHORS, _build

    spec = ANCHORS if model_name == "anchors" else MODELS[model_name]
    model, step = _build(spec, "whole_step", step_compiler=way)
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
    modules = list(folder.rglob("*.py"))
    if modules:  # the largest module inductor wrote is the step's
        module = max(modules, key=lambda path: path.stat().st_size)
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
            compile_part = f" (compile {cold['compile']:.1f} s)" if cold["compile"] is not None else ""
            print(
                f"repeat {repeat + 1}/{args.repeats} {way}: cold first call {cold['first']:.1f} s{compile_part}, "
                f"second run {second['first']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    medians = {way: _medians(pairs) for way, pairs in results.items()}
    base = medians["inductor"]
    print(f"\n{args.model}: whole step, fp32, {args.repeats} repeats (medians)")
    print("| way | cold first call (s) | of it, compile (s) | C++ kernels | second run's first call (s) "
          "| later step (s) | cold, warm, later vs inductor |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for way, figures in medians.items():
        compile_seconds = "-" if figures["compile"] is None else f"{figures['compile']:.1f}"
        print(
            f"| {way} | {figures['cold']:.1f} | {compile_seconds} | {figures['kernels']} | {figures['warm']:.1f} "
            f"| {figures['later']:.3f} | {base['cold'] / figures['cold']:.2f}x, {base['warm'] / figures['warm']:.2f}x, "
            f"{base['later'] / figures['later']:.2f}x |"
        )


def _medians(pairs: list[tuple[dict, dict]]) -> dict:
    """A way's medians over repeats: cold and warm first calls, the cold compile, later steps, kernels."""
    compiles = [cold["compile"] for cold, _ in pairs if cold["compile"] is not None]
    return {
        "cold": statistics.median(cold["first"] for cold, _ in pairs),
        "warm": statistics.median(second["first"] for _, second in pairs),
        "compile": statistics.median(compiles) if compiles else None,
        "later": statistics.median(cold["later"] for cold, _ in pairs),
        "kernels": pairs[0][0]["kernels"],
    }


if __name__ == "__main__":
    main()
