"""titanpod's training step against MaxText's, both compiled by libtpu for the same TPU slice on this host.

For each case the same model, slice, sequences a chip, sequence length and recompute choice are
compiled twice: titanpod's step (``titanpod-pretrain --compile-for``, from ``envs/tpu``) and MaxText's
own (its ``train_compile`` path, ``envs/maxtext/compile_step.py``, from ``envs/maxtext``). Printed for
both: HBM a chip, the compiler's flops, its estimated step time, MFU at that time (titanpod's
convention for both: 6N + attention without causal halving, the same model flops on each side) and
the compile's wall time, with titanpod / MaxText ratios. Every figure but the compile time is the
compiler's own, the same on every host: no quiet machine is needed.

Attention is counted alike on both sides: Pallas rows use titanpod's Splash (which declares its
cost) against MaxText's tokamax Splash (which declares one too); ``xla`` rows use XLA's own
dot-product attention on both (titanpod's ``sdpa``, MaxText's ``dot_product``). The head + loss is
counted alike too: MaxText keeps its logits for the backward, and titanpod's Pallas loss is told to
(``--kernels.pallas-loss.keep-logits true``; ``--no-keep-logits`` compiles it recomputing them). Layers
are unrolled on both sides (titanpod's with ``--train.scan-layers false``, whatever the recipe says), so
the two programs have the same shape; ``--layers 2,4`` compiles two shallow copies of each and extrapolates by depth.

    uv run python tools/bench/tpu_aot_vs_maxtext.py                      # Llama 3 8B, Qwen 3 8B on v5p-8
    uv run python tools/bench/tpu_aot_vs_maxtext.py --cases llama3_8b --layers 2 --attention pallas
    uv run python tools/bench/tpu_aot_vs_maxtext.py --cases llama3_70b --attention pallas --scanned-memory

Shallow compiles do not extrapolate memory honestly; ``--scanned-memory`` takes each side's memory from one
compile of the whole depth with its layers as one loop (how both train) and its flops and time from unrolled
compiles of 2 and 4 layers, extrapolated by depth: a loop's body counts once in the compiler's cost analysis.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GiB = 1024**3
COST_DEPTHS = (2, 4)
"""The unrolled depths whose compiles give the costs when memory comes from a scanned one (titanpod's
``--compile-for`` uses the same two for a recipe that scans)."""
NO_LOOPS = (
    "--xla_tpu_enable_windowed_einsum_for_all_gather=false --xla_tpu_enable_windowed_einsum_for_reduce_scatter=false"
)


@dataclass(frozen=True)
class Case:
    """One model on one slice, as each side names it."""

    recipe: str
    """titanpod's recipe."""
    maxtext_model: str
    """MaxText's model name."""
    slice: str
    """The slice, e.g. ``v5p-8``."""
    seq_len: int
    """Tokens a sequence."""
    batch: int = 1
    """Sequences a chip."""
    maxtext_sets: tuple[str, ...] = ()
    """MaxText overrides (``KEY=VALUE``) that make ``maxtext_model``'s config this model, where MaxText ships none of
    its own, or that set what the recipe sets (host-memory moments)."""
    maxtext_layers: int | None = None
    """The model's depth where ``maxtext_sets`` resize another model's config (MaxText's full depth is then that
    model's)."""


CASES = {
    "llama3_8b": Case("llama3_8b", "llama3-8b", "v5p-8", 8192),
    "qwen3_8b": Case("qwen3_8b", "qwen3-8b", "v5p-8", 8192),
    "llama3_70b": Case("llama3_70b", "llama3-70b", "v5p-64", 8192),
    "qwen3_235b_a22b": Case("qwen3_235b_a22b", "qwen3-235b-a22b", "v5p-256", 4096),
    # The single-chip recipes, at their own batches, on one v5e. MaxText 0.2.5 has no Llama 3.2 config: Llama 3 8B's,
    # resized to 1B's shapes (16 blocks of width 2,048, MLP 8,192, 64-wide heads, tied embeddings), with the AdamW
    # moments in host memory as the recipe keeps them (MaxText's optimizer_memory_host_offload).
    "qwen3_06b": Case("qwen3_06b", "qwen3-0.6b", "v5e-1", 4096, batch=4),
    "llama32_1b": Case(
        "llama32_1b",
        "llama3-8b",
        "v5e-1",
        4096,
        batch=2,
        maxtext_layers=16,
        maxtext_sets=(
            "base_emb_dim=2048",
            "base_mlp_dim=8192",
            "head_dim=64",
            "logits_via_embedding=true",
            "optimizer_memory_host_offload=true",
        ),
    ),
}


def titanpod_figures(
    case: Case,
    attention: str,
    layers: list[int],
    folder: Path,
    reuse: bool = False,
    keep_logits: bool = True,
    scanned_memory: bool = False,
) -> dict:
    """titanpod's report.json for the case (full depth, or extrapolated from ``layers``); with ``reuse``, the one
    an earlier run left in ``folder``. ``keep_logits``: the Pallas loss keeps its logits for the backward, as
    MaxText's step does (``kernels.pallas_loss.keep_logits``). ``scanned_memory``: the memory of one compile of
    the whole depth with the blocks as one loop, and the costs extrapolated from unrolled compiles of 2 and 4
    layers (``--compile-for``'s own way for a recipe that scans; ``layers`` is then unused)."""
    if reuse and (folder / "report.json").exists():
        return json.loads((folder / "report.json").read_text())
    kernels = ["--kernels.attention", "splash" if attention == "pallas" else "sdpa"]
    kernels += ["--kernels.pallas-loss.keep-logits", "true" if keep_logits else "false"]
    command = [
        "uv", "run", "--project", str(ROOT / "envs/tpu"), "titanpod-pretrain", "--recipe", case.recipe,
        "--compile-for", case.slice, "--data.batch-size", str(case.batch), "--data.seq-len", str(case.seq_len),
        "--train.memory-policy", "recompute", "--train.grad-accum-steps", "1",
        "--train.scan-layers", "true" if scanned_memory else "false",
        *kernels,
        "--compile-output", str(folder),
    ]  # fmt: skip
    if layers and not scanned_memory:
        command += ["--compile-layers", *map(str, layers)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT / "envs/tpu", capture_output=True, text=True, check=False)
    if not (folder / "report.json").exists():
        raise RuntimeError(f"titanpod's compile of {case.recipe} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    report = json.loads((folder / "report.json").read_text())
    report["wall_seconds"] = time.perf_counter() - started
    return report


def maxtext_figures(
    case: Case,
    attention: str,
    layers: list[int],
    folder: Path,
    depth: int,
    reuse: bool = False,
    scanned_memory: bool = False,
) -> dict:
    """MaxText's figures for the case: one compile at full depth, or two extrapolated to ``depth`` layers; with
    ``scanned_memory``, the memory of a full-depth compile with the layers as one loop beside those costs."""
    runs = [maxtext_compile(case, attention, n, folder, reuse) for n in (layers or [None])]
    figures = runs[0] if len(runs) == 1 else extrapolated(*runs, depth)
    if scanned_memory:
        figures = with_memory_from(figures, maxtext_compile(case, attention, None, folder, reuse, scanned=True))
    return figures


def extrapolated(low: dict, high: dict, depth: int) -> dict:
    """MaxText's JSON for ``depth`` layers from compiles of ``low`` and ``high`` (fewer and more layers): every
    memory and cost figure on the line through the two, compile times summed. Where either estimates its step at
    no time or less (libtpu does for MaxText's v5e steps), the result's estimate is 0: none."""
    if high["layers"] <= low["layers"]:
        raise ValueError(f"extrapolation needs two rising depths, not {low['layers']} and {high['layers']}")
    scale = (depth - low["layers"]) / (high["layers"] - low["layers"])

    def grow(a: float, b: float) -> float:
        return a + (b - a) * scale

    merged = dict(high)
    merged["memory_per_chip"] = {
        key: grow(low["memory_per_chip"][key], value) for key, value in high["memory_per_chip"].items()
    }
    merged["cost_per_chip"] = {
        key: grow(low["cost_per_chip"][key], value) for key, value in high["cost_per_chip"].items()
    }
    if min(low["cost_per_chip"]["optimal_seconds"], high["cost_per_chip"]["optimal_seconds"]) <= 0:
        merged["cost_per_chip"]["optimal_seconds"] = 0.0  # no estimate: a line through a negative one means nothing
    merged["compile_seconds"] = low["compile_seconds"] + high["compile_seconds"]
    merged["layers"] = depth
    merged["extrapolated_from"] = [low["layers"], high["layers"]]
    return merged


def with_memory_from(costed: dict, scanned: dict) -> dict:
    """``costed`` (unrolled or extrapolated) with its memory replaced by ``scanned``'s, a compile of the same depth
    with the layers as one loop; its compile time becomes the scanned compile's, the costed ones' kept apart."""
    if scanned["layers"] not in (None, costed["layers"]):
        raise ValueError(f"the scanned compile has {scanned['layers']} layers, the costed figures {costed['layers']}")
    merged = dict(costed)
    if "refused" in scanned:  # the step as trained does not fit the chip: no memory to report but the refusal
        merged["refused"] = scanned["refused"]
        merged["memory_per_chip"] = None
    else:
        merged["memory_per_chip"] = dict(scanned["memory_per_chip"])
    merged["compile_seconds"] = scanned["compile_seconds"]
    merged["cost_compile_seconds"] = costed["compile_seconds"]
    merged["scanned"] = True
    return merged


def hbm_refusal(output: str) -> str | None:
    """libtpu's line refusing a program for the chip's memory (``Ran out of memory on HBM, the total memory required
    for HLO temporaries (17.07G) exceeds available HBM (15.75G)``), shortened; ``None`` where there is none."""
    found = re.search(r"memory required for HLO temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)", output)
    return f"{found[1]} GiB of temporaries, over the chip's {found[2]}" if found else None


def maxtext_python(env: dict[str, str]) -> str | None:
    """A Python 3.12 for ``envs/maxtext`` (MaxText needs one), given to its ``uv run`` alone: ``UV_PYTHON`` set for
    the whole bench would make the bench's own ``uv run`` at the root rebuild the root environment with it. The
    ``UV_PYTHON`` already in ``env``, else the first 3.12 interpreter on this host (pyenv's, the system's), else
    None (uv then looks for one itself)."""
    if env.get("UV_PYTHON"):
        return env["UV_PYTHON"]
    pyenv = Path(env.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates = [*sorted(pyenv.glob("3.12*/bin/python3.12"), reverse=True), Path("/usr/bin/python3.12"),
                  Path("/usr/local/bin/python3.12")]  # fmt: skip
    which = shutil.which("python3.12", path=env.get("PATH"))
    candidates += [Path(which)] if which else []
    return next((str(path) for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)


def maxtext_compile(
    case: Case, attention: str, depth: int | None, folder: Path, reuse: bool = False, scanned: bool = False
) -> dict:
    """One MaxText compile (``envs/maxtext/compile_step.py``) and its JSON; with ``reuse``, an earlier run's.
    ``scanned``: the layers as one loop (memory as trained; costs count the loop's body once). A step the compiler
    refuses for the chip's memory is a result, not a failure: its JSON holds the compiler's line as ``refused``."""
    out = folder / f"maxtext-{depth or 'all'}{'-scanned' if scanned else ''}.json"
    if reuse and out.exists():
        return json.loads(out.read_text())
    command = [
        "uv", "run", "--project", str(ROOT / "envs/maxtext"), "python", "compile_step.py", "--model",
        case.maxtext_model, "--topology", case.slice, "--per-device-batch", str(case.batch), "--seq-len",
        str(case.seq_len), "--remat", "full", "--attention", "splash" if attention == "pallas" else "dot_product",
        "--layers", str(depth or case.maxtext_layers or "all"), "--out", str(out),
        *(["--scan-layers"] if scanned else []), *(arg for item in case.maxtext_sets for arg in ("--set", item)),
    ]  # fmt: skip
    env = {**os.environ, "LIBTPU_INIT_ARGS": f"{os.environ.get('LIBTPU_INIT_ARGS', '')} {NO_LOOPS}".strip()}
    python = maxtext_python(env)
    if python:
        env["UV_PYTHON"] = python
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT / "envs/maxtext", capture_output=True, text=True, env=env, check=False)
    refusal = hbm_refusal(done.stderr)
    if not out.exists() and refusal:
        refused = {"layers": depth or case.maxtext_layers, "refused": refusal,
                   "compile_seconds": time.perf_counter() - started}  # fmt: skip
        out.write_text(json.dumps(refused, indent=1))
    if not out.exists():
        raise RuntimeError(f"MaxText's compile of {case.maxtext_model} failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


NO_ESTIMATE = "-"
"""What the time columns show where libtpu's estimate is not positive (MaxText's v5e programs on libtpu 0.0.52)."""


def row(
    side: str,
    hbm: float,
    temporaries: float,
    flops: float,
    seconds: float,
    mfu: float,
    compile_s: str,
    refused: str | None = None,
) -> str:
    """One side's Markdown row; the step time and MFU as ``NO_ESTIMATE`` where the estimate is not positive, the
    memory as the compiler's refusal where it refused the step for the chip's memory."""
    timed = seconds > 0
    memory = f"does not fit: {refused} | {NO_ESTIMATE}" if refused else f"{hbm / GiB:.2f} | {temporaries / GiB:.2f}"
    return (
        f"| {side} | {memory} | {flops / 1e12:,.1f} | "
        f"{f'{seconds:.3f}' if timed else NO_ESTIMATE} | {f'{mfu:.1%}' if timed else NO_ESTIMATE} | {compile_s} |"
    )


def ratio(ours: float, theirs: float) -> str:
    """``ours / theirs`` to two places, ``NO_ESTIMATE`` unless both are positive."""
    return f"{ours / theirs:.2f}" if ours > 0 and theirs > 0 else NO_ESTIMATE


def compile_time(seconds: float, cost_seconds: float | None) -> str:
    """The compile column: one compile's seconds, or ``scanned + unrolled`` when memory and costs came apart."""
    return f"{seconds:.0f}" if cost_seconds is None else f"{seconds:.0f} + {cost_seconds:.0f}"


def compare(
    case: Case,
    attention: str,
    layers: list[int],
    folder: Path,
    reuse: bool = False,
    keep_logits: bool = True,
    scanned_memory: bool = False,
    summary: dict | None = None,
) -> list[str]:
    """The case's two rows and the ratio row, as Markdown. ``scanned_memory``: memory from full-depth compiles with
    the layers as one loop on both sides, flops and time extrapolated from unrolled compiles of 2 and 4 layers.
    ``summary``, when given, receives each side's HBM a chip (GiB) and estimated step (s), and the shape (the
    ``--json`` file's entry for the case)."""
    if scanned_memory:
        layers = list(COST_DEPTHS)
    ours = titanpod_figures(case, attention, layers, folder / "titanpod", reuse, keep_logits, scanned_memory)
    theirs = maxtext_figures(case, attention, layers, folder, ours["model_layers"], reuse, scanned_memory)
    model_flops, peak = ours["model_flops_per_chip"], ours["chip_peak_flops"]
    memory = theirs["memory_per_chip"] or {}  # none where the compiler refused the step for the chip's memory
    their_total = (
        memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"] + memory["temporary_bytes"]
        + memory["generated_code_bytes"]
    ) if memory else 0.0  # fmt: skip
    their_temporaries = memory.get("temporary_bytes", 0.0)
    their_seconds = theirs["cost_per_chip"]["optimal_seconds"]
    ours_total, ours_seconds = ours["program"]["memory"]["total"], ours["estimated_step_seconds"]
    depth = f"{ours['layers']} layers" + (" (extrapolated)" if ours["extrapolated_from"] else "")
    if scanned_memory:
        depth = (
            f"{ours['layers']} layers (memory: one compile of all layers as a loop; flops and time: extrapolated "
            f"from unrolled {' and '.join(map(str, COST_DEPTHS))})"
        )
    if summary is not None:
        summary.update(
            slice=case.slice, batch=case.batch, seq_len=case.seq_len, attention=attention,
            maxtext_hbm_gib=their_total / GiB if memory else None, maxtext_refused=theirs.get("refused"),
            maxtext_estimated_seconds=their_seconds,
            titanpod_hbm_gib=ours_total / GiB, titanpod_estimated_seconds=ours_seconds,
        )  # fmt: skip
    head = f"**{case.recipe} on {case.slice}, {case.batch} x {case.seq_len} tokens a chip, {attention}, {depth}**"
    return [
        head,
        "",
        "| step | HBM a chip (GiB) | of it temporaries | compiler TFLOP a chip | est. step (s) | est. MFU "
        "| compile (s) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        row(
            "MaxText",
            their_total,
            their_temporaries,
            theirs["cost_per_chip"]["flops"],
            their_seconds,
            model_flops / their_seconds / peak if their_seconds > 0 else 0.0,
            compile_time(theirs["compile_seconds"], theirs.get("cost_compile_seconds")),
            refused=theirs.get("refused"),
        ),
        row(
            "titanpod",
            ours_total,
            ours["program"]["memory"]["temporaries"],
            ours["program"]["flops"],
            ours_seconds,
            model_flops / ours_seconds / peak,
            compile_time(ours["compile_seconds"], ours.get("cost_compile_seconds") if scanned_memory else None),
        ),
        f"| titanpod / MaxText | {ratio(ours_total, their_total)} | "
        f"{ratio(ours['program']['memory']['temporaries'], their_temporaries)} | "
        f"{ours['program']['flops'] / theirs['cost_per_chip']['flops']:.2f} | {ratio(ours_seconds, their_seconds)} | "
        f"{ratio(their_seconds, ours_seconds)} | {ours['compile_seconds'] / theirs['compile_seconds']:.2f} |",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="llama3_8b,qwen3_8b", help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument(
        "--attention", default="pallas,xla", help="pallas (Splash both sides), xla (XLA's own), or both"
    )
    parser.add_argument("--layers", default="", help="two depths to extrapolate from (e.g. 2,4); empty: full depth")
    parser.add_argument("--keep", type=Path, help="keep every report in this folder")
    parser.add_argument("--reuse", action="store_true", help="with --keep: print from the reports already there")
    parser.add_argument(
        "--keep-logits",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="titanpod's Pallas loss keeps its logits for the backward as MaxText does (6 N V M flops, N x V more "
        "memory); --no-keep-logits recomputes them (10 N V M flops)",
    )
    parser.add_argument(
        "--scanned-memory",
        action="store_true",
        help="memory from one full-depth compile a side with the layers as one loop (as both train), flops and "
        f"time extrapolated from unrolled compiles of {' and '.join(map(str, COST_DEPTHS))} layers; --layers unused",
    )
    parser.add_argument(
        "--json",
        type=Path,
        help="also write each case's HBM a chip and estimated step, both sides, here (tools/bench/chip_step.py "
        "--maxtext reads it)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.cases.split(",") if name not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; known: {', '.join(CASES)}")
    if args.json is not None and not args.json.parent.is_dir():  # found now, not after the compiles
        parser.error(f"--json {args.json}: its folder {args.json.parent} does not exist")
    summaries: dict[str, dict] = {}
    layers = [int(n) for n in args.layers.split(",") if n]
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tpu-aot-") as scratch:
        base = args.keep or Path(scratch)
        for name in args.cases.split(","):
            for attention in args.attention.split(","):
                folder = base / f"{name}-{attention}"
                folder.mkdir(parents=True, exist_ok=True)
                print(f"compiling {name} ({attention}) for {CASES[name].slice} on both sides ...", file=sys.stderr)
                summary = summaries.setdefault(name if attention == "pallas" else f"{name}-{attention}", {})
                lines += compare(
                    CASES[name], attention, layers, folder, args.reuse, args.keep_logits, args.scanned_memory, summary
                )
                print("\n".join(lines[-7:]), flush=True)
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text(json.dumps(summaries, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
