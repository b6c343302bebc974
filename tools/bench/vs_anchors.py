"""titanpod beside torchtitan's Trainer and a transformers loop, on one shape, in one run, with ratios.

    uv run python tools/bench/vs_anchors.py [--anchors ../shared/anchors] [--repeats 2]
        [--precisions fp32,bf16] [--modes eager,whole_step,eager+cpu_flash,whole_step+cpu_flash] [--steps 20]

Drives the anchor harness (its README: torchtitan 0.3.0's real ``Trainer`` and a plain
``LlamaForCausalLM`` loop, each in its own environment, built by its ``setup.sh``) and
titanpod's step API (the harness's ``run_product.py``, in this environment, with the reference
ops; ``MODE+ATTENTION`` modes through ``anchor_titanpod_kernels.py``, the same measurement with
that ``kernels.attention``) on torchtitan's llama3 debugmodel shape: one measured matmul peak,
then every system ``--repeats`` times, interleaved. Per precision it prints tokens/s (median of
the repeats' step medians), the ratio to torchtitan and to transformers, MFU against the measured peak and each repeat's
first step (compilation included).

bf16: torchtitan with bf16 parameters through its FSDP mixed precision, transformers
under ``torch.autocast`` (``anchor_hf_autocast.py`` here, on the harness's shape and clock),
titanpod with ``train.precision bf16`` (autocast; fp32 parameters and optimizer state).
The transformers loop is the harness's plain one (no clipping; torchtitan and titanpod clip at 1.0).

The whole step's compiled-step cache starts empty (a fresh ``XDG_CACHE_HOME`` and inductor
cache for the run): the first repeat's first step is a cold compile, later repeats load
what the first one saved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--anchors", type=Path, default=REPO.parent / "shared" / "anchors")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--precisions", default="fp32")
    parser.add_argument(
        "--modes",
        default="eager,whole_step,eager+cpu_flash,whole_step+cpu_flash",
        help="titanpod step modes; MODE+ATTENTION runs the mode with that kernels.attention",
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--wait-quiet", type=float, default=60.0, help="seconds each runner waits for idle CPUs")
    args = parser.parse_args()
    anchors = args.anchors.resolve()
    tt_python, hf_python = Path("/tmp/anchor-venv-tt/bin/python"), Path("/tmp/anchor-venv-hf/bin/python")
    if not (tt_python.exists() and hf_python.exists()):
        print("building the anchors' environments (setup.sh)...", file=sys.stderr, flush=True)
        subprocess.run(["bash", str(anchors / "setup.sh")], check=True)
    scratch = Path(tempfile.mkdtemp(prefix="vs-anchors-"))
    env = {**os.environ, "XDG_CACHE_HOME": str(scratch / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor")}
    out = scratch / "results.jsonl"
    common = ["--steps", str(args.steps), "--wait-quiet", str(args.wait_quiet), "--out", str(out)]

    def run(label: str, command: list[str]) -> None:
        print(f"  {label}", file=sys.stderr, flush=True)
        done = subprocess.run(command, cwd=anchors, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            print(f"  {label} failed:\n{done.stderr[-3000:]}", file=sys.stderr)

    subprocess.run([str(tt_python), "peak.py", "--out", str(out)], cwd=anchors, check=True, stdout=subprocess.DEVNULL)
    peak = json.loads(out.read_text().splitlines()[-1])["peak_flops"]
    print(f"measured fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s", file=sys.stderr)
    with_peak = [*common, "--peak-flops", str(peak)]
    precisions = args.precisions.split(",")
    modes = args.modes.split(",")
    for repeat in range(1, args.repeats + 1):
        for precision in precisions:
            print(f"repeat {repeat}/{args.repeats}, {precision}:", file=sys.stderr, flush=True)
            dtype = ["--param-dtype", "bfloat16"] if precision == "bf16" else []
            run("torchtitan", [str(tt_python), "run_torchtitan.py", *dtype, *with_peak])
            if precision == "bf16":
                hf_runner = str(HERE / "anchor_hf_autocast.py")
                run("transformers", [str(hf_python), hf_runner, "--anchors", str(anchors), *with_peak])
            else:
                run("transformers", [str(hf_python), "run_hf.py", *with_peak])
            for mode in modes:
                step_mode, _, attention = mode.partition("+")
                if attention:
                    kernels = str(HERE / "anchor_titanpod_kernels.py")
                    product = [sys.executable, kernels, "--anchors", str(anchors), "--mode", step_mode,
                               "--attention", attention, "--precision", precision]  # fmt: skip
                else:
                    product = [sys.executable, "run_product.py", "--mode", mode, "--precision", precision]
                run(f"titanpod {mode}", [*product, *with_peak])
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    print_table(records, precisions, peak)
    print(f"records: {out}", file=sys.stderr)


def _label(record: dict) -> tuple[str, str]:
    """(precision, system) of a result record."""
    system, config = record["system"], record.get("config", {})
    if system.startswith("titanpod-"):
        _, mode, precision = system.split("-")
        return precision, f"titanpod {mode}"
    if system == "torchtitan-trainer":
        return ("bf16" if config.get("fsdp_param_dtype") == "bfloat16" else "fp32"), "torchtitan Trainer"
    if system == "hf-transformers-llama-autocast":
        return "bf16", "transformers loop"
    return "fp32", "transformers loop"


def print_table(records: list[dict], precisions: list[str], peak: float) -> None:
    """One table per precision: tokens/s (median over repeats), ratios to the anchors, MFU, first steps."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        if record.get("tokens_per_s") is not None and record.get("system") != "cpu-matmul-peak":
            runs.setdefault(_label(record), []).append(record)
    for precision in precisions:
        rows = {system: group for (p, system), group in runs.items() if p == precision}
        median = {system: statistics.median(r["tokens_per_s"] for r in group) for system, group in rows.items()}
        titan, hf = median.get("torchtitan Trainer"), median.get("transformers loop")
        print(f"\n{precision} (measured peak {peak / 1e9:.1f} GFLOP/s)")
        print("| system | tok/s | vs torchtitan | vs transformers | MFU | first step (s) per repeat | noisy |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for system in sorted(rows, key=lambda name: (not name.startswith("torchtitan"), name)):
            group, value = rows[system], median[system]
            firsts = ", ".join(f"{_first_step(r):.1f}" for r in group)
            noisy = sum(bool(r.get("noisy")) for r in group)
            print(
                f"| {system} | {value:,.0f} | {_ratio(value, titan)} | {_ratio(value, hf)} | "
                f"{statistics.median(r['mfu_cpu'] for r in group):.1%} | {firsts} | {noisy}/{len(group)} |"
            )


def _first_step(record: dict) -> float:
    return float(record["timing"]["step_times_s"][0])


def _ratio(value: float, baseline: float | None) -> str:
    return f"{value / baseline:.2f}" if baseline else "-"


if __name__ == "__main__":
    main()
