"""Training speed on one TPU chip, measured, beside the compiler's estimate for the same program.

Each configuration trains in its own process (one program may hold the chip; the next starts when it has let
go), for ``--steps`` steps on the xla lane (or the lane its flags name: ``qwen3_0.6b_tpu_lane`` runs the same
model on ``torch.device("tpu")``, which needs torch_tpu), without checkpoints or validation; its metrics.jsonl
gives:
- measured: tokens/s over the steps after the first, model TFLOP/s, MFU (titanpod's count against the chip's
  peak), the device's peak memory (``peak_memory_gib``), and, for a run on another lane, its tokens/s over the
  xla lane's for the same flags otherwise (``of xla``: ``qwen3_0.6b_tpu_lane`` against ``qwen3_0.6b``, when both
  ran in the same call);
- the compiler's figures for the program it ran: the bytes a device it needs (``program_memory_gib``) and,
  where the compiler gives one for the whole step (not through a layer scan), its estimated step time, from
  which measured / estimated.
The chip's own bf16 matmul rate (an 8,192-cube product in JAX) is measured in the same run, as the ceiling
MFU is read against. ``--maxtext FILE`` adds MaxText's own step for the same model and shape, compiled for the
same chip where MaxText is installed (``tools/bench/tpu_aot_vs_maxtext.py --cases qwen3_06b,llama32_1b
--scanned-memory --json FILE``; a TPU VM rarely has MaxText): its HBM, ours over it, and its estimated
tokens/s where libtpu gives a positive estimate.

    python tools/bench/chip_step.py                   # every configuration below
    python tools/bench/chip_step.py --only qwen3_0.6b qwen3_0.6b_unscanned --steps 20 --out chip.json
    python tools/bench/chip_step.py --extra 'mine=qwen3_0.6b --data.batch-size 6'

Run on a TPU machine with titanpod importable (docs/installing.md, "A TPU VM without network").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

QWEN3_06B = (
    "--recipe qwen3_8b --model.flavor 0.6B --parallel.fsdp 1 --data.source synthetic --data.path None "
    "--data.name None --data.seq-len 4096 --data.batch-size 4"
)
LLAMA32_1B = (
    "--recipe llama3_8b --model.flavor 1B --parallel.fsdp 1 --data.source synthetic --data.path None "
    "--data.name None --data.seq-len 4096 --data.batch-size 2"
)
"""Llama 3.2 1B at 2 x 4,096 tokens: with AdamW's moments on the chip it does not fit one v5e."""

CONFIGURATIONS: dict[str, str] = {
    "qwen3_0.6b": QWEN3_06B,
    "qwen3_0.6b_unscanned": QWEN3_06B + " --train.no-scan-layers",
    "qwen3_0.6b_sdpa": QWEN3_06B + " --kernels.attention sdpa",
    "qwen3_0.6b_2x8192": QWEN3_06B + " --data.seq-len 8192 --data.batch-size 2",
    "qwen3_0.6b_tpu_lane": QWEN3_06B + " --device.lane tpu --train.step-mode whole_step",
    "qwen3_0.6b_2x4096": QWEN3_06B + " --data.batch-size 2",
    "qwen3_0.6b_2x4096_tpu_lane": QWEN3_06B + " --data.batch-size 2 --device.lane tpu --train.step-mode whole_step",
    "llama3.2_1b_offload": LLAMA32_1B + " --train.optimizer-offload",
    "llama3.2_1b_offload_overlap": "llama3.2_1b_offload --train.optimizer-offload-overlap",
    "llama3.2_1b_offload_x8_summed": "llama3.2_1b_offload --train.grad-accum-steps 8 --train.sum-gradients-in-loop",
}
"""Name -> the training command's flags. A value may start with another configuration's name (its flags first)."""

MAXTEXT_CASES = {
    "qwen3_0.6b": "qwen3_06b",
    "qwen3_0.6b_tpu_lane": "qwen3_06b",
    "llama3.2_1b_offload": "llama32_1b",
    "llama3.2_1b_offload_overlap": "llama32_1b",
}
"""Configuration -> its case in ``tpu_aot_vs_maxtext.py``'s ``--json`` file (the same model, shape and chip)."""

QUIET_RUN = "--train.log-every 5 --checkpoint.every 0 --checkpoint.no-at-end --output.no-save-weights"
"""What every measured run adds: reports every 5 steps, nothing saved, no validation."""
LANE_FLAGS = {"--device.lane": 1, "--train.step-mode": 1}
"""The flags (and how many values each takes) that choose a run's lane, left out to find its xla twin."""


def without_lane(flags: list[str]) -> list[str]:
    """``flags`` without those that choose the lane and its step mode: what a run on another lane shares with its
    xla-lane twin."""
    kept, skip = [], 0
    for word in flags:
        if skip:
            skip -= 1
        elif word in LANE_FLAGS:
            skip = LANE_FLAGS[word]
        else:
            kept.append(word)
    return kept


def xla_twin(result: dict, results: list[dict]) -> dict | None:
    """The xla-lane run among ``results`` with ``result``'s flags otherwise, for a run on another lane; else None."""
    flags = shlex.split(result["flags"])
    if lane_of(flags) == "xla":
        return None
    twins = (r for r in results if "error" not in r and lane_of(shlex.split(r["flags"])) == "xla")
    return next((r for r in twins if without_lane(shlex.split(r["flags"])) == without_lane(flags)), None)


def flags_of(name: str, table: dict[str, str]) -> list[str]:
    """The flags of configuration ``name``, a leading configuration name expanded."""
    words = shlex.split(table[name])
    if words and words[0] in table and words[0] != name:
        return flags_of(words[0], table) + words[1:]
    return words


def lane_of(flags: list[str]) -> str:
    """The lane a run with ``flags`` uses: the last ``--device.lane`` given, else the xla lane."""
    lanes = [flags[i + 1] for i in range(len(flags) - 1) if flags[i] == "--device.lane"]
    return lanes[-1] if lanes else "xla"


def measure(
    name: str, flags: list[str], steps: int, runs_dir: Path, logs_dir: Path, timeout: float | None = None
) -> dict:
    """Train configuration ``name`` for ``steps`` steps in a process of its own; its figures from metrics.jsonl.
    The run's whole output goes to ``logs_dir/NAME.log``. A run still going after ``timeout`` seconds is stopped
    (with every process it started) and reported as failed, with the reports it had written."""
    lane = lane_of(flags)
    command = [sys.executable, "-m", "titanpod.pretrain.cli", "--device.lane", lane, *flags, *shlex.split(QUIET_RUN)]
    command += ["--train.steps", str(steps), "--train.warmup-steps", "1", "--data.validation-every", "0"]
    command += ["--output.runs-dir", str(runs_dir), "--output.run-name", name, "--output.start-over"]
    env = dict(os.environ)
    if lane == "xla":  # torch_tpu, where installed, would claim the device torchax needs (XlaBackend)
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    started = time.perf_counter()
    returncode, output = _run(command, env, timeout)
    logs_dir.mkdir(parents=True, exist_ok=True)
    log = logs_dir / f"{name}.log"
    log.write_text(output)
    result: dict = {"name": name, "flags": " ".join(flags), "exit": returncode, "log": str(log),
                    "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    rows = _rows(runs_dir / name / "metrics.jsonl")
    reports = [row for row in rows if "tokens_per_second" in row]
    if returncode != 0 or not reports:
        result["error"] = error_summary(output)
        if returncode is None:
            result["error"] = f"stopped after {timeout:.0f} s ({len(reports)} reports written): {result['error']}"
        return result
    first, last = reports[0], reports[-1]
    result.update({key: last.get(key) for key in ("tokens_per_second", "tflops_per_second", "mfu", "peak_memory_gib")})
    result.update({key: first.get(key) for key in ("program_memory_gib", "estimated_step_seconds", "compile_seconds")})
    result["losses"] = [row["loss"] for row in reports]
    tokens_per_step = _tokens_per_step(flags)
    if result.get("estimated_step_seconds") and tokens_per_step:
        result["estimated_tokens_per_second"] = tokens_per_step / result["estimated_step_seconds"]
        result["measured_over_estimated"] = result["tokens_per_second"] / result["estimated_tokens_per_second"]
    return result


def _run(command: list[str], env: dict[str, str], timeout: float | None) -> tuple[int | None, str]:
    """Run ``command`` in a session of its own; its exit code (None when stopped at ``timeout``) and output."""
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
            return process.returncode, output
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            return None, output + f"\n[stopped by chip_step after {timeout:.0f} s]\n"
        except KeyboardInterrupt:  # the run is in a session of its own, out of the terminal's reach: stop it too
            os.killpg(process.pid, signal.SIGKILL)
            raise


ERROR_LINE = re.compile(r"(Error|Exception|Failed|error)\b|RESOURCE_EXHAUSTED")
"""What marks a line that says why a run failed (the tail of a compiler's error is often a dump of its graph)."""


def error_summary(output: str, lines: int = 4, limit: int = 1500) -> str:
    """Why a run failed, for a table cell and a JSON file: its first lines that name an error, each cut short,
    then the end of its output."""
    marked = [line.strip() for line in output.splitlines() if ERROR_LINE.search(line)]
    said = [line[: limit // (lines + 1)] for line in dict.fromkeys(marked)][:lines]
    return _readable("\n".join([*said, "...", output[-limit // (lines + 1) :]]))


def _readable(text: str) -> str:
    """``text`` without the frames of rich's error boxes, for a table cell and a JSON file."""
    lines = [line.strip(" │╭╮╰╯─") for line in text.splitlines()]
    return " ".join(line for line in lines if line)


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tokens_per_step(flags: list[str]) -> int | None:
    """Tokens a step trains on: sequence length x sequences x micro-batches (the last of each flag given)."""
    values = {flags[i]: flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("--")}
    try:
        micro_batches = int(values.get("--train.grad-accum-steps", 1))
        return int(values["--data.seq-len"]) * int(values["--data.batch-size"]) * micro_batches
    except (KeyError, ValueError):
        return None


def chip_matmul_tflops(size: int = 8192, repeats: int = 20) -> float | None:
    """The chip's bf16 matmul rate in TFLOP/s on random operands (in a process of its own, so it lets go of the
    chip). On a v5e on 2026-12-06 it read 185.6 TFLOP/s, and 185.7 with operands of ones."""
    code = (
        "import time, jax, jax.numpy as jnp\n"
        f"n, r = {size}, {repeats}\n"
        "a, b = jax.random.normal(jax.random.key(0), (2, n, n), jnp.bfloat16)\n"
        "f = jax.jit(lambda a, b: a @ b); f(a, b).block_until_ready()\n"
        "t = time.perf_counter()\n"
        "for _ in range(r): c = f(a, b)\n"
        "c.block_until_ready(); print(2 * n**3 * r / (time.perf_counter() - t) / 1e12)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    try:
        return float(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None


def maxtext_columns(result: dict, maxtext: dict[str, dict]) -> dict[str, float | None]:
    """MaxText's figures for ``result``'s configuration (``MAXTEXT_CASES``) from ``tpu_aot_vs_maxtext.py``'s
    ``--json``: its HBM a chip, ours (the compiler's figure for the program the run ran) over it, and its
    estimated tokens/s (``None`` where libtpu's estimate is not positive, as on v5e with libtpu 0.0.52). Where the
    compiler refused MaxText's step for the chip's memory, its HBM is ``None`` and ``maxtext_refused`` says why."""
    case = maxtext.get(MAXTEXT_CASES.get(result["name"], ""), {})
    ours, theirs = result.get("program_memory_gib"), case.get("maxtext_hbm_gib")
    seconds = case.get("maxtext_estimated_seconds", 0.0)
    return {
        "maxtext_hbm_gib": theirs,
        "maxtext_refused": case.get("maxtext_refused"),
        "hbm_of_maxtext": ours / theirs if ours and theirs else None,
        "maxtext_estimated_tokens_per_second": case["batch"] * case["seq_len"] / seconds if seconds > 0 else None,
    }


def show(results: list[dict], matmul: float | None, maxtext: dict[str, dict] | None = None) -> None:
    """The figures as a table, ratios beside them; MaxText's columns when ``maxtext`` is given."""
    if matmul is not None:
        print(f"chip bf16 matmul (8192^3, JAX): {matmul:.1f} TFLOP/s")
    header = f"{'configuration':<28} {'tokens/s':>9} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>8} {'program GiB':>11}"
    header += f" {'est. tokens/s':>13} {'meas/est':>8} {'of matmul':>9} {'of xla':>6}"
    print(header + (f" {'MaxText GiB':>11} {'of MaxText':>10} {'MaxText est. tok/s':>18}" if maxtext else ""))
    for r in results:
        if "error" in r:
            print(f"{r['name']:<28} failed (exit {r['exit']}): {r['error'][:300]} (whole output: {r['log']})")
            continue
        estimate = r.get("estimated_tokens_per_second")
        of_matmul = r["tflops_per_second"] / matmul if matmul else None
        twin = xla_twin(r, results)
        of_xla = r["tokens_per_second"] / twin["tokens_per_second"] if twin else None
        print(
            f"{r['name']:<28} {r['tokens_per_second']:>9,.0f} {r['tflops_per_second']:>8.1f} {r['mfu']:>6.1%} "
            f"{_num(r.get('peak_memory_gib')):>8} {_num(r.get('program_memory_gib')):>11} "
            f"{'-' if estimate is None else f'{estimate:,.0f}':>13} {_num(r.get('measured_over_estimated')):>8} "
            f"{_num(of_matmul):>9} {_num(of_xla):>6}",
            end="",
        )
        if maxtext:
            theirs = maxtext_columns(r, maxtext)
            estimate = theirs["maxtext_estimated_tokens_per_second"]
            hbm = "refused" if theirs["maxtext_refused"] else _num(theirs["maxtext_hbm_gib"])
            print(
                f" {hbm:>11} {_num(theirs['hbm_of_maxtext']):>10} "
                f"{'-' if estimate is None else f'{estimate:,.0f}':>18}",
                end="",
            )
        print()


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def read_maxtext(path: Path, parser: argparse.ArgumentParser) -> dict[str, dict]:
    """``tpu_aot_vs_maxtext.py``'s ``--json`` file, or the parser's error naming the file and how to make it."""
    make = "write it with tools/bench/tpu_aot_vs_maxtext.py --cases qwen3_06b,llama32_1b --scanned-memory --json FILE"
    try:
        figures = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        parser.error(f"--maxtext {path}: cannot read it ({error}); {make}")
    if not isinstance(figures, dict) or not all("maxtext_hbm_gib" in case for case in figures.values()):
        parser.error(f"--maxtext {path}: not MaxText's figures (a case without maxtext_hbm_gib); {make}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="configurations to run (default: every one)")
    parser.add_argument("--extra", action="append", default=[], help="NAME='flags' (may start with a configuration)")
    parser.add_argument("--steps", type=int, default=15, help="steps a run (reports every 5)")
    parser.add_argument("--runs-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "chip-step-runs")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--logs-dir", type=Path, help="where each run's whole output goes (default: the runs dir)")
    parser.add_argument("--no-matmul", action="store_true", help="skip measuring the chip's matmul rate")
    parser.add_argument("--timeout", type=float, help="stop a run still going after this many seconds")
    parser.add_argument(
        "--maxtext", type=Path, help="MaxText's figures: tools/bench/tpu_aot_vs_maxtext.py's --json file"
    )
    args = parser.parse_args()
    maxtext = read_maxtext(args.maxtext, parser) if args.maxtext else None
    table = dict(CONFIGURATIONS)
    for extra in args.extra:
        name, _, flags = extra.partition("=")
        table[name.strip()] = flags
    names = args.only or [*CONFIGURATIONS, *(e.partition("=")[0].strip() for e in args.extra)]
    unknown = [name for name in names if name not in table]
    if unknown:
        raise SystemExit(f"Unknown configuration {unknown[0]!r}; known: {', '.join(table)} (or add one with --extra).")
    matmul = None if args.no_matmul else chip_matmul_tflops()
    results = []
    for name in names:
        print(f"-- {name}: {' '.join(flags_of(name, table))}", flush=True)
        logs_dir = args.logs_dir or args.runs_dir
        results.append(measure(name, flags_of(name, table), args.steps, args.runs_dir, logs_dir, args.timeout))
        print(json.dumps(results[-1]), flush=True)
        if args.out is not None:  # kept as each run ends, so that a call cut short keeps what it measured
            args.out.write_text(json.dumps({"matmul_tflops": matmul, "results": results}, indent=1))
        time.sleep(5)  # the chip may refuse a program started just as another let go
    show(results, matmul, maxtext)


if __name__ == "__main__":
    main()
