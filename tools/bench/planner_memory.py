"""The dry-run planner's memory prediction against the measured peak of real CPU training steps.

    uv run python tools/bench/planner_memory.py                       # every debug recipe, default settings
    uv run python tools/bench/planner_memory.py --case llama3_debug --json

Each case runs in a fresh process: the recipe's model, data and training step (its step
mode and memory policy) train for a few steps on the CPU, and the process's peak resident
memory is read (Linux ``VmHWM``). What counts is how far the peak rises above the
resident memory just before the model is built, after one step of a one-layer model of
the same family has loaded every code path the step touches (code pages are not what the
planner predicts). The planner's figure is its per-device total for one CPU device.

glibc's default malloc keeps freed blocks resident once its adaptive mmap threshold has
risen, so resident memory would measure the allocator's retention, not the program's
need: the measured processes run with ``MALLOC_MMAP_THRESHOLD_=65536``, which returns
freed large blocks to the system. The ``default malloc`` column shows the same run
without that setting, for reference. For the same reason the runs set
``train.keep_host_memory false`` (on by default on the cpu lane: it keeps every freed
block in the process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASES: dict[str, list[str]] = {
    "llama3_debug": [],
    "qwen3_debug": [],
    "qwen3_moe_debug": [],
    "llama3_debug whole_step recompute": ["--train.step-mode", "whole_step", "--train.memory-policy", "recompute"],
    "llama3_debug whole_step selective": ["--train.step-mode", "whole_step", "--train.memory-policy", "selective"],
}
"""Case name (recipe first) -> recipe overrides. Whole steps run their graph op by op (compiler none)."""


def measure(case: str, steps: int) -> dict:
    """Run one case in this process; return predicted and measured bytes."""
    import dataclasses
    import gc

    from titanpod.device import get_backend
    from titanpod.device.memory import host_memory_stats, reset_host_peak
    from titanpod.graph import build_step
    from titanpod.kernels import model_ops
    from titanpod.pretrain.command import parse_recipe
    from titanpod.recipes.families import build_model, get_flavor
    from titanpod.recipes.planner import plan_run
    from titanpod.recipes.planner.plan import with_changes
    from titanpod.runs.pretrain import build_run_data

    name = case.split()[0]
    recipe = parse_recipe(["--recipe", name, "--device.lane", "cpu", *CASES[case]])
    if recipe.train.step_mode == "whole_step":
        recipe = with_changes(recipe, train={"compiler": "none"})
    # keep_host_memory would keep the one-layer warm-up's freed buffers resident in the baseline and let the
    # measured run reuse them, so the rise above the baseline would understate the run's need.
    recipe = with_changes(recipe, train={"steps": steps, "warmup_steps": 0, "keep_host_memory": False})
    backend = get_backend("cpu")
    batches = build_run_data(recipe, get_flavor(recipe.model.family, recipe.model.flavor).vocab_size, 0, 1).train
    micro = [next(batches) for _ in range(steps)]

    def train_steps(flavor: object, count: int) -> None:
        model = build_model(recipe.model.family, flavor, model_ops(recipe.kernels))
        model.to_empty(device="cpu")
        model.init_weights(0)
        step = build_step(model, recipe.train, backend)
        for batch in micro[:count]:
            step([batch], 1e-3)

    one_layer = dataclasses.replace(get_flavor(recipe.model.family, recipe.model.flavor), n_layers=1)
    train_steps(one_layer, 1)
    gc.collect()
    base = host_memory_stats().current_bytes
    reset_host_peak()
    train_steps(recipe.model.flavor, steps)
    measured = host_memory_stats().peak_bytes - base
    from titanpod.device import ChipSpec

    plan = plan_run(recipe, ChipSpec("cpu", 1e12, 1 << 40), chips=1, target_mfu=0.5)
    memory = plan.memory
    return {
        "case": case,
        "predicted": memory.total,
        "measured": measured,
        "ratio": measured / memory.total,
        "parts": dataclasses.asdict(memory),
    }


def _run_case(case: str, steps: int, tuned_malloc: bool) -> dict:
    env = dict(os.environ)
    if tuned_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    else:
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
    out = subprocess.run(
        [sys.executable, __file__, "--one", case, "--steps", str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"case {case!r} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help=f"cases to run (default all): {', '.join(CASES)}")
    parser.add_argument("--steps", type=int, default=3, help="training steps per case")
    parser.add_argument("--json", action="store_true", help="print one JSON line per case")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.steps)))
        return
    mib = 1024**2
    if not args.json:
        print(f"{'case':40s} {'predicted':>10s} {'measured':>10s} {'ratio':>6s} {'default malloc':>15s}")
    for case in args.case or list(CASES):
        result = _run_case(case, args.steps, tuned_malloc=True)
        if args.json:
            print(json.dumps(result))
            continue
        plain = _run_case(case, args.steps, tuned_malloc=False)
        print(
            f"{case:40s} {result['predicted'] / mib:8.1f} MiB {result['measured'] / mib:7.1f} MiB "
            f"{result['ratio']:6.2f} {plain['measured'] / mib:11.1f} MiB"
        )


if __name__ == "__main__":
    main()
