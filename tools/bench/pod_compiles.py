"""Every pod recipe compiled by libtpu for its own slice: docs/recipes.md's table of memory, flops and speed.

Runs ``titanpod-pretrain --recipe NAME --compile-for target`` from ``envs/tpu`` for each recipe
(by default extrapolated from compiles of 2 and 4 layers: ``--layers 2,4``; ``--layers all`` compiles
the whole depth; ``--layers scan`` compiles the whole depth with the blocks as one loop,
``--train.scan-layers true``, for the memory, and unrolled copies of 2 and 4 layers for flops and time)
and prints one Markdown row each: the slice, HBM a chip from the compiler and from
the planner, the compiler's flops over the model's, its estimated step time and the MFU at that time
(the compiler's cost model, not a measurement), and the compile's wall time. ``--reports DIR`` prints
the table from reports written before (``DIR/<recipe>/report.json``) without compiling.

    uv run python tools/bench/pod_compiles.py
    uv run python tools/bench/pod_compiles.py --recipes llama3_8b,qwen3_8b --keep /tmp/pods
    uv run python tools/bench/pod_compiles.py --recipes llama3_70b,llama3_405b --layers scan
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GiB = 1024**3
POD_RECIPES = ("llama3_8b", "llama3_70b", "llama3_405b", "qwen3_8b", "qwen3_32b", "qwen3_235b_a22b")
"""The LLM pod recipes (flux1_12b compiles through titanpod-diffusion, which has no xla step yet)."""


def compile_recipe(recipe: str, layers: str, folder: Path) -> dict:
    """Compile one recipe for its slice; its report (with ``exit`` and ``wall_seconds`` added), or the failure."""
    command = ["uv", "run", "titanpod-pretrain", "--recipe", recipe, "--compile-for", "target"]
    if layers == "scan":
        command += ["--train.scan-layers", "true"]
    elif layers != "all":
        command += ["--compile-layers", *layers.split(",")]
    command += ["--compile-output", str(folder)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT / "envs/tpu", capture_output=True, text=True, check=False)
    path = folder / "report.json"
    if not path.exists():
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error")]
        return {"recipe": recipe, "error": (lines or [done.stderr.strip()[-300:]])[-1][:300]}
    report = json.loads(path.read_text())
    report |= {"exit": done.returncode, "wall_seconds": time.perf_counter() - started}
    return report


def table_row(report: dict) -> str:
    """One Markdown row of the table."""
    if "error" in report:
        return f"| {report['recipe']} | | did not compile: {report['error']} | | | | | |"
    total = report["program"]["memory"]["total"]
    depth = f"{report['layers']}" + (" (from {} and {})".format(*report["extrapolated_from"])
                                     if report["extrapolated_from"] else "")  # fmt: skip
    if report.get("cost_from"):
        depth += ", as one loop (flops and time from {} and {})".format(*report["cost_from"])
    step = report["estimated_step_seconds"]
    timing = "no estimate" if step is None else f"{step:.3f} s, {report['estimated_mfu']:.1%}"
    fits = "fits" if report["fits"] else "**does not fit**"
    cost_compile = f" (+ {report['cost_compile_seconds']:.0f} s for the cost)" if report.get("cost_from") else ""
    return (
        f"| {report['recipe']} | {report['slice']} ({report['chips']} chips), {depth} layers | "
        f"{total / GiB:.1f} of {report['chip_hbm'] / GiB:.0f} GiB, {fits} | "
        f"{report['planner_bytes'] / GiB:.1f} GiB ({report['planner_difference']:+.0%}) | "
        f"{report['flops_ratio']:.2f} | {timing} | {report['compile_seconds']:.0f} s{cost_compile} |"
    )


HEADER = (
    "| recipe | slice, layers | HBM a chip (compiler) | planner | compiler / model flops | est. step, est. MFU "
    "| compile |\n| --- | --- | --- | --- | --- | --- | --- |"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", default=",".join(POD_RECIPES), help="comma-separated recipe names")
    parser.add_argument("--layers", default="2,4", help="two depths to extrapolate from, 'all', or 'scan'")
    parser.add_argument("--keep", type=Path, help="write each report under this folder")
    parser.add_argument("--reports", type=Path, help="print the table from reports already in this folder")
    args = parser.parse_args(argv)
    rows = [HEADER]
    with tempfile.TemporaryDirectory(prefix="pod-compiles-") as scratch:
        base = args.reports or args.keep or Path(scratch)
        for recipe in args.recipes.split(","):
            if args.reports:
                report = json.loads((base / recipe / "report.json").read_text())
            else:
                print(f"compiling {recipe} for its slice ...", file=sys.stderr, flush=True)
                report = compile_recipe(recipe, args.layers, base / recipe)
            rows.append(table_row(report))
            print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
