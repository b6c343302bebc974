"""Compile MaxText's own training step for a TPU topology on a host without a TPU, and report its figures.

The step is built and compiled by MaxText's ahead-of-time path (its `train_compile.main`), from its
own base.yml plus the overrides below; this script only adds a hook that keeps the compiled object,
then reads the per-chip memory (`memory_analysis`) and cost (`cost_analysis`) off it and writes them
as JSON. It is the baseline a titanpod benchmark compares against.

    uv run python compile_step.py --model llama3-8b --topology v5p-8 --per-device-batch 1 \
        --seq-len 8192 --remat full --attention splash --layers 2 --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

# Model names as MaxText spells them (configs/models/<name>.yml), for the families titanpod trains.
KNOWN_MODELS = ("llama3-8b", "llama3.1-8b", "llama3-70b", "llama3.1-70b", "qwen3-8b", "qwen3-235b-a22b")

# --attention: what each choice sets in MaxText's config.
ATTENTION_OVERRIDES = {
    # TPU splash attention through tokamax's kernel, which declares a cost estimate to XLA, so its
    # flops appear in cost_analysis (MaxText's default splash kernel declares none).
    "splash": ["attention=flash", "use_tokamax_splash=true"],
    # XLA's own attention: plain einsums and a softmax, all visible to cost_analysis.
    "dot_product": ["attention=dot_product"],
}

# Collective matmuls lower to while loops whose bodies cost_analysis counts once; these flags keep
# the all-gather / reduce-scatter and the matmul apart so every flop is counted.
NO_WINDOWED_EINSUM = (
    "--xla_tpu_enable_windowed_einsum_for_all_gather=false --xla_tpu_enable_windowed_einsum_for_reduce_scatter=false"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help=f"MaxText model name, e.g. {', '.join(KNOWN_MODELS)}")
    p.add_argument("--topology", required=True, help="target slice as MaxText names it, e.g. v5p-8 (4 chips), v5p-64")
    p.add_argument("--num-slices", type=int, default=1, help="number of target slices (default 1)")
    p.add_argument("--per-device-batch", type=float, default=1.0, help="sequences per chip per step (default 1)")
    p.add_argument("--seq-len", type=int, default=8192, help="tokens per sequence (default 8192)")
    p.add_argument(
        "--remat", default="full", help="MaxText remat_policy, e.g. full, minimal, save_qkv_proj (default full)"
    )
    p.add_argument("--attention", choices=sorted(ATTENTION_OVERRIDES), default="splash")
    p.add_argument("--layers", default="all", help="decoder layers to build: a number, or 'all' for the model's own")
    p.add_argument(
        "--scan-layers",
        action="store_true",
        help="build the decoder layers as one scanned loop (MaxText's scan_layers=true): the memory of the step "
        "as a recipe runs it at full depth, but cost_analysis then counts the loop's body once",
    )
    p.add_argument(
        "--no-windowed-einsum",
        action="store_true",
        help="add the libtpu flags that turn collective matmuls off, so cost_analysis counts all their flops",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any further MaxText override")
    p.add_argument("--out", type=Path, help="write the JSON here too (it is always printed)")
    args = p.parse_args(argv)
    if args.layers != "all":
        try:
            if int(args.layers) < 1:
                raise ValueError
        except ValueError:
            p.error(f"--layers must be a positive number or 'all', not {args.layers!r}")
    for item in args.set:
        if "=" not in item:
            p.error(f"--set takes KEY=VALUE, not {item!r}")
    return args


def install_jax_shims() -> None:
    """Give jax 0.10.2 the one name MaxText 0.2.5 imports that it lacks.

    `jax.experimental.xla_metadata.must_fuse_call` arrived in a later jax. MaxText imports it at module
    level but calls it only in its pure-JAX flash attention (for non-TPU backends), which a TPU compile
    never traces; a pass-through decorator is enough for the import to succeed.
    """
    import jax.experimental.xla_metadata as xla_metadata

    if hasattr(xla_metadata, "must_fuse_call"):
        return

    def must_fuse_call(*_args: Any, **_kwargs: Any):
        def decorate(fn):
            return fn

        return decorate

    xla_metadata.must_fuse_call = must_fuse_call


def maxtext_overrides(args: argparse.Namespace) -> list[str]:
    """MaxText key=value overrides on top of its base.yml."""
    overrides = [
        f"model_name={args.model}",
        f"compile_topology={args.topology}",
        f"compile_topology_num_slices={args.num_slices}",
        f"per_device_batch_size={args.per_device_batch:g}",
        f"max_target_length={args.seq_len}",
        f"remat_policy={args.remat}",
        # Layers unrolled unless asked: a scanned stack is a while loop, whose body cost_analysis counts once.
        f"scan_layers={'true' if args.scan_layers else 'false'}",
        "dataset_type=synthetic",
        "enable_checkpointing=false",
        "run_name=compile_step",
        *ATTENTION_OVERRIDES[args.attention],
    ]
    if args.layers != "all":
        # A model config's own keys may only be overridden with override_model_config on.
        overrides += ["override_model_config=true", f"base_num_decoder_layers={int(args.layers)}"]
    overrides += args.set
    return overrides


def memory_figures(compiled) -> dict[str, int]:
    stats = compiled.memory_analysis()
    fig = {
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "temporary_bytes": int(stats.temp_size_in_bytes),
        "generated_code_bytes": int(stats.generated_code_size_in_bytes),
    }
    fig["total_bytes"] = fig["argument_bytes"] + fig["output_bytes"] - fig["alias_bytes"] + fig["temporary_bytes"]
    return fig


def cost_figures(compiled) -> dict[str, float | None]:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax returns one dict per program
        cost = cost[0] if cost else {}
    cost = cost or {}

    def get(key: str) -> float | None:
        value = cost.get(key)
        return None if value is None else float(value)

    return {"flops": get("flops"), "bytes_accessed": get("bytes accessed"), "optimal_seconds": get("optimal_seconds")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    # libtpu takes /tmp/libtpu_lockfile so that one process owns the chips; a compile owns none, and
    # another process on this host (a second compile, a test) may hold the lock.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if args.no_windowed_einsum:
        os.environ["LIBTPU_INIT_ARGS"] = (os.environ.get("LIBTPU_INIT_ARGS", "") + " " + NO_WINDOWED_EINSUM).strip()

    install_jax_shims()
    import jax
    import maxtext
    from maxtext.trainers.pre_train import train_compile
    from maxtext.utils import maxtext_utils

    base_yml = Path(maxtext.__file__).parent / "configs" / "base.yml"
    model_yml = base_yml.parent / "models" / f"{args.model}.yml"
    if not model_yml.exists():
        shipped = sorted(p.stem for p in model_yml.parent.glob("*.yml"))
        raise SystemExit(f"MaxText ships no model config {args.model!r}; it has: {', '.join(shipped)}")

    # MaxText's main builds the config, the topology mesh, the abstract state and the train step, then
    # calls its module-level jit_and_compile and drops the result. Wrap that one function to keep it.
    captured: dict[str, Any] = {}
    jit_and_compile = train_compile.jit_and_compile

    def keep_compiled(func, func_input_args, func_input_kwargs, mesh, *rest, **kwargs):
        config = rest[-2] if len(rest) >= 2 else kwargs["config"]
        # Time XLA's compile apart from tracing and lowering, which jit_and_compile does first.
        lowered_compile = jax.stages.Lowered.compile

        def timed_compile(self, *a, **kw):
            captured["xla_start"] = time.perf_counter()
            return lowered_compile(self, *a, **kw)

        jax.stages.Lowered.compile = timed_compile
        start = time.perf_counter()
        try:
            compiled = jit_and_compile(func, func_input_args, func_input_kwargs, mesh, *rest, **kwargs)
        finally:
            jax.stages.Lowered.compile = lowered_compile
        end = time.perf_counter()
        captured.update(compiled=compiled, mesh=mesh, config=config, seconds=end - start)
        captured["xla_seconds"] = end - captured.get("xla_start", start)
        return compiled

    train_compile.jit_and_compile = keep_compiled
    start = time.perf_counter()
    try:
        train_compile.main(["compile_step", str(base_yml), *maxtext_overrides(args)])
    finally:
        train_compile.jit_and_compile = jit_and_compile
    total_seconds = time.perf_counter() - start
    if "compiled" not in captured:
        raise SystemExit("MaxText's train_compile finished without compiling a train step")

    compiled, config, mesh = captured["compiled"], captured["config"], captured["mesh"]
    model_tflops, _, _ = maxtext_utils.calculate_tflops_training_per_device(config, log=False)
    cost = cost_figures(compiled)
    result: dict[str, Any] = {
        "model": args.model,
        "topology": args.topology,
        "num_slices": args.num_slices,
        "chips": int(mesh.devices.size),
        "device_kind": mesh.devices.flat[0].device_kind,
        "mesh": dict(zip(mesh.axis_names, (int(n) for n in mesh.devices.shape), strict=True)),
        "per_device_batch": args.per_device_batch,
        "seq_len": args.seq_len,
        "layers": int(config.num_decoder_layers),
        "scanned": bool(args.scan_layers),
        "attention": args.attention,
        "remat": args.remat,
        "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS", ""),
        "memory_per_chip": memory_figures(compiled),
        "cost_per_chip": cost,
        # MaxText's own count of one step's training flops per chip (6 x params x tokens plus attention).
        "model_flops_per_chip": model_tflops * 1e12,
        "compiler_to_model_flops": (cost["flops"] / (model_tflops * 1e12)) if cost["flops"] and model_tflops else None,
        # Trace, lower and compile the step (MaxText's jit_and_compile), and the XLA compile alone.
        "compile_seconds": round(captured["seconds"], 2),
        "xla_compile_seconds": round(captured["xla_seconds"], 2),
        "total_seconds": round(total_seconds, 2),
        "peak_host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "versions": versions(),
    }
    return result


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("maxtext", "jax", "jaxlib", "libtpu", "tokamax", "flax")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    gib = 1024**3
    mem = result["memory_per_chip"]
    print(
        f"{args.model} on {args.topology}: compile {result['compile_seconds']} s, "
        f"{mem['argument_bytes'] / gib:.2f} GiB arguments + {mem['temporary_bytes'] / gib:.2f} GiB temporaries "
        f"= {mem['total_bytes'] / gib:.2f} GiB a chip, optimal {result['cost_per_chip']['optimal_seconds']} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
