"""titanpod's Pallas kernels, compiled by Mosaic, against plain-JAX references: parity and time.

    python3 tools/bench/pallas_on_tpu.py [--reps 10] [--only splash_causal,loss] [--out table.txt]
    uv run python tools/bench/pallas_on_tpu.py --interpret --tiny   # on a CPU, Pallas interpret mode

Needs only JAX (and numpy): where PyTorch is not installed (a bare TPU machine) the kernels' torch-free
modules (``titanpod.kernels.pallas``) are imported by registering ``titanpod``, ``titanpod.kernels`` and
``titanpod.device`` as bare packages over this checkout's folders, without running their ``__init__``.

Each case builds a kernel exactly as the PyTorch op does, runs it forward and forward + backward, and
compares outputs and gradients with a plain-JAX reference computed in float32 from the same (rounded)
inputs under ``jax.default_matmul_precision('highest')``. The error reported is the largest absolute
difference and that over the reference's largest magnitude ("rel"), which must stay under the bound of the
inputs' dtype (``BOUNDS``). Timing: median of ``--reps`` calls after a compile and two warm-up calls, each
waited for with ``block_until_ready``, of the kernel and of the XLA reference at the inputs' dtype (the
same plain-JAX function, not upcast). TFLOP/s count the model's flops (a causal mask halves attention's),
not what a kernel recomputes, against the chip's dense bf16 peak from ``titanpod.device.chips``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "titanpod": [ROOT / "packages/kernels/src/titanpod", ROOT / "packages/device/src/titanpod"],
    "titanpod.kernels": [ROOT / "packages/kernels/src/titanpod/kernels"],
    "titanpod.device": [ROOT / "packages/device/src/titanpod/device"],
}

BOUNDS = {
    "bfloat16": {"forward": 2e-2, "gradient": 4e-2},
    "float32": {"forward": 1e-4, "gradient": 1e-3},
}
"""Largest error over the reference's largest magnitude allowed, per input dtype: bfloat16 outputs and
gradients are rounded to 8 bits of mantissa (about 4e-3 of their size) and the kernels feed bfloat16
probabilities to their second matmul, as the reference at that dtype does."""

IGNORE_INDEX = -100
"""Label of a row the loss leaves out (``titanpod.models.IGNORE_INDEX``, the loss kernel's default)."""


def torch_free_modules() -> dict[str, types.ModuleType]:
    """The kernels' torch-free modules and the chip table, by name; where PyTorch cannot be imported, the
    ``titanpod`` packages are first registered bare (their folders, no ``__init__``)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        for name, folders in PACKAGES.items():
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__path__ = [str(folder) for folder in folders]
                sys.modules[name] = package
    names = {"splash": "titanpod.kernels.pallas.splash_kernel", "loss": "titanpod.kernels.pallas.loss_kernel",
             "gmm": "titanpod.kernels.pallas.gmm_kernel", "chips": "titanpod.device.chips"}  # fmt: skip
    return {key: importlib.import_module(name) for key, name in names.items()}


@dataclass
class Case:
    """One kernel at one shape: what it computes, its reference, inputs and model flops."""

    name: str
    shape: str
    kernel: Callable[..., Any]
    reference: Callable[..., Any]
    inputs: Callable[[], tuple[Any, ...]]
    """Builds the inputs (the last of them, when ``integer_tail``, take no gradient)."""
    forward_flops: float
    backward_flops: float
    integer_tail: int = 0
    """How many trailing inputs are integer (labels, group sizes) and take no gradient."""


@dataclass
class Result:
    """What one case measured."""

    name: str
    shape: str
    errors: list[tuple[str, float, float, float]] = field(default_factory=list)
    """(what, max abs error, rel, bound) per compared output or gradient."""
    times: dict[str, float] = field(default_factory=dict)
    """Median seconds: ``kernel_fwd``, ``kernel_fwd_bwd``, ``xla_fwd``, ``xla_fwd_bwd``."""
    failure: str | None = None

    @property
    def passed(self) -> bool:
        """No failure, and every error under its bound."""
        return self.failure is None and all(rel <= bound for _, _, rel, bound in self.errors)


def attention_reference(causal: bool) -> Callable[..., Any]:
    """Plain-JAX GQA attention [B, H, S, D] scaled by ``1/sqrt(D)``, one query head (with its kv head) at a time
    (``lax.map`` of a rematerialized body, so only one head's [S, S] scores exist at once); scores and softmax
    in float32, the probabilities cast to the values' dtype for the second matmul."""
    import jax
    import jax.numpy as jnp

    def attention(q_BHSD: Any, k_BKSD: Any, v_BKSD: Any) -> Any:
        B, H, S, D = q_BHSD.shape
        G = H // k_BKSD.shape[1]
        k_NSD, v_NSD = (jnp.repeat(x, G, axis=1).reshape(B * H, S, D) for x in (k_BKSD, v_BKSD))

        def head(args: tuple[Any, Any, Any]) -> Any:
            q_SD, k_SD, v_SD = args
            s_ST = jnp.einsum("sd,td->st", q_SD, k_SD, preferred_element_type=jnp.float32) * D**-0.5
            if causal:
                i = jnp.arange(S)
                s_ST = jnp.where(i[None, :] <= i[:, None], s_ST, -jnp.inf)
            p_ST = jax.nn.softmax(s_ST, axis=-1).astype(v_SD.dtype)
            return jnp.einsum("st,td->sd", p_ST, v_SD, preferred_element_type=jnp.float32).astype(q_SD.dtype)

        out = jax.lax.map(jax.checkpoint(head), (q_BHSD.reshape(B * H, S, D), k_NSD, v_NSD))
        return out.reshape(B, H, S, D)

    return attention


def loss_reference(chunk_rows: int) -> Callable[..., Any]:
    """Plain-JAX mean cross-entropy of ``h_NM @ w_VM.T`` over labelled rows, ``chunk_rows`` rows at a time
    (``lax.map`` of a rematerialized body: one chunk's [rows, V] logits exist at once), logits in float32."""
    import jax
    import jax.numpy as jnp

    def loss(h_NM: Any, w_VM: Any, labels_N: Any) -> Any:
        N, M = h_NM.shape
        pad = -N % chunk_rows
        h = jnp.pad(h_NM, ((0, pad), (0, 0))).reshape(-1, chunk_rows, M)
        labels = jnp.pad(labels_N, (0, pad), constant_values=IGNORE_INDEX).reshape(-1, chunk_rows)

        def chunk(args: tuple[Any, Any]) -> Any:
            h_cM, labels_c = args
            logits = jnp.dot(h_cM, w_VM.T, preferred_element_type=jnp.float32)
            lse = jax.nn.logsumexp(logits, axis=-1)
            target = jnp.take_along_axis(logits, jnp.maximum(labels_c, 0)[:, None], axis=-1)[:, 0]
            return jnp.where(labels_c != IGNORE_INDEX, lse - target, 0.0).sum()

        total = jax.lax.map(jax.checkpoint(chunk), (h, labels)).sum()
        return total / (labels_N != IGNORE_INDEX).sum()

    return loss


def gmm_reference(x_TI: Any, w_EOI: Any, sizes_E: Any) -> Any:
    """XLA's own grouped matmul (``lax.ragged_dot``): rows in consecutive groups of ``sizes_E``, each times
    its group's weight transposed; rows past the groups come out zero."""
    import jax

    return jax.lax.ragged_dot(x_TI, w_EOI.transpose(0, 2, 1), sizes_E, preferred_element_type=x_TI.dtype)


def build_cases(
    mods: dict[str, types.ModuleType], tiny: bool, interpret: bool, dtype_name: str, gmm_tiling: str = ""
) -> list[Case]:
    """The benchmark's cases: Llama 3 8B's causal attention and head loss, FLUX.1's unmasked attention (a whole
    and a ragged length), Qwen3-235B-A22B's expert matmul; ``tiny`` shrinks every shape for interpret mode.
    ``gmm_tiling`` (``"rows,in,out"``) replaces ``GroupedMatmulConfig``'s default tiles."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    dtype = jnp.dtype(dtype_name)
    splash, loss, gmm = mods["splash"], mods["loss"], mods["gmm"]
    cases = []

    def normal(key: int, shape: tuple[int, ...], scale: float = 1.0) -> Any:
        return (jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale).astype(dtype)

    def attention_case(name: str, B: int, H: int, K: int, S: int, D: int, causal: bool, block: int) -> Case:
        config = splash.SplashConfig(block_q=block, block_kv=block, causal=causal, interpret=interpret)
        kernel = splash.splash_attention_fn(config, S, H // K, D, dtype.itemsize, False, interpret)
        pairs = B * H * S * S * (0.5 if causal else 1.0)
        return Case(
            name, f"B{B} H{H} K{K} S{S} D{D} {dtype_name}", kernel, attention_reference(causal),
            lambda: (normal(1, (B, H, S, D)), normal(2, (B, K, S, D)), normal(3, (B, K, S, D))),
            forward_flops=4 * pairs * D, backward_flops=10 * pairs * D,
        )  # fmt: skip

    if tiny:
        cases.append(attention_case("splash_causal", 1, 4, 2, 256, 128, True, 128))
        cases.append(attention_case("splash_full", 1, 2, 2, 256, 128, False, 128))
        cases.append(attention_case("splash_full_ragged", 1, 2, 2, 200, 128, False, 128))
        N, M, V, chunk = 200, 128, 1000, 64
        E, I, O, sizes = 4, 256, 128, [50, 0, 120, 30]  # noqa: E741 - I: input width
    else:
        cases.append(attention_case("splash_causal", 1, 32, 8, 8192, 128, True, 512))
        cases.append(attention_case("splash_full", 1, 24, 24, 4608, 128, False, 512))
        cases.append(attention_case("splash_full_ragged", 1, 24, 24, 4173, 128, False, 512))
        N, M, V, chunk = 8192, 4096, 128256, 1024
        E, I, O = 128, 4096, 1536  # noqa: E741 - I: input width
        # 512 tokens routed to 8 of 128 experts each, unevenly (a Zipf-like preference), some experts idle
        rng = np.random.default_rng(0)
        prefs = 1.0 / np.arange(1, E + 1) ** 1.1
        sizes = np.bincount(rng.choice(E, size=512 * 8, p=prefs / prefs.sum()), minlength=E).tolist()

    head = loss.make_pallas_cross_entropy(loss.PallasLossConfig(interpret=interpret), V, M, interpret, dtype.itemsize)

    def loss_inputs() -> tuple[Any, ...]:
        labels = jax.random.randint(jax.random.key(6), (N,), 0, V, jnp.int32)
        dropped = jax.random.uniform(jax.random.key(7), (N,)) < 0.05
        return normal(4, (N, M)), normal(5, (V, M), M**-0.5), jnp.where(dropped, IGNORE_INDEX, labels)

    cases.append(Case("pallas_loss", f"N{N} M{M} V{V} {dtype_name}", head, loss_reference(chunk), loss_inputs,
                      forward_flops=2.0 * N * M * V, backward_flops=4.0 * N * M * V, integer_tail=1))  # fmt: skip
    kept = loss.PallasLossConfig(interpret=interpret, keep_logits=True)
    kept_head = loss.make_pallas_cross_entropy(kept, V, M, interpret, dtype.itemsize)
    cases.append(Case("pallas_loss_kept", f"N{N} M{M} V{V} {dtype_name}, logits kept", kept_head,
                      loss_reference(chunk), loss_inputs, forward_flops=2.0 * N * M * V,
                      backward_flops=4.0 * N * M * V, integer_tail=1))  # fmt: skip

    tiles = {}
    if gmm_tiling:
        tiles = dict(zip(("tile_rows", "tile_in", "tile_out"), map(int, gmm_tiling.split(",")), strict=True))
    config = gmm.GroupedMatmulConfig(interpret=interpret, **tiles)
    tiled = gmm.tiled_gmm(config, interpret)
    T = sum(sizes)
    T_pad = -(-T // config.tile_rows) * config.tile_rows

    def gmm_kernel(x_TI: Any, w_EOI: Any, sizes_E: Any) -> Any:
        return tiled(jnp.pad(x_TI, ((0, T_pad - T), (0, 0))), w_EOI, sizes_E)[:T]

    def gmm_inputs() -> tuple[Any, ...]:
        return normal(8, (T, I)), normal(9, (E, O, I), I**-0.5), jnp.asarray(sizes, jnp.int32)

    tile_text = f"tiles {config.tile_rows},{config.tile_in},{config.tile_out}"
    gmm_shape = f"E{E} T{T} I{I} O{O} max group {max(sizes)} {tile_text} {dtype_name}"
    cases.append(Case("gmm", gmm_shape, gmm_kernel, gmm_reference,
                      gmm_inputs, forward_flops=2.0 * T * I * O, backward_flops=4.0 * T * I * O,
                      integer_tail=1))  # fmt: skip
    return cases


def _timed(fn: Callable[..., Any], args: tuple[Any, ...], reps: int) -> float:
    """Median wall seconds of ``fn(*args)`` over ``reps`` calls after a compile and two warm-up calls."""
    import jax

    for _ in range(3):
        jax.block_until_ready(fn(*args))
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def _with_gradients(fn: Callable[..., Any], n_float: int) -> Callable[..., Any]:
    """``(*args, cotangent) -> (output, gradients of the first n_float args)`` under ``jax.vjp``."""
    import jax

    def run(*args_and_cotangent: Any) -> Any:
        *args, cotangent = args_and_cotangent

        def of_floats(*floats: Any) -> Any:
            return fn(*floats, *args[n_float:])

        out, pullback = jax.vjp(of_floats, *args[:n_float])
        return out, pullback(cotangent.astype(out.dtype))

    return run


def run_case(case: Case, reps: int, dtype_name: str) -> Result:
    """Parity of ``case``'s forward and gradients against its float32 reference, then the four timings."""
    import jax
    import jax.numpy as jnp

    result = Result(case.name, case.shape)
    inputs = case.inputs()
    n_float = len(inputs) - case.integer_tail
    shape = jax.eval_shape(case.kernel, *inputs)
    cotangent = jax.random.normal(jax.random.key(11), shape.shape, jnp.float32)
    bound = BOUNDS[dtype_name]

    @jax.jit
    def error(got: Any, want: Any) -> tuple[Any, Any]:
        diff = jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32)))
        return diff, diff / jnp.max(jnp.abs(want.astype(jnp.float32)))

    kernel_grads = jax.jit(_with_gradients(case.kernel, n_float))
    got = kernel_grads(*inputs, cotangent)
    with jax.default_matmul_precision("highest"):
        upcast = tuple(x.astype(jnp.float32) for x in inputs[:n_float]) + inputs[n_float:]
        want = jax.jit(_with_gradients(case.reference, n_float))(*upcast, cotangent)
        del upcast
    names = ["output"] + [f"grad {i}" for i in range(n_float)]
    for name, g, w in zip(names, [got[0], *got[1]], [want[0], *want[1]], strict=True):
        diff, rel = (float(x) for x in error(g, w))
        result.errors.append((name, diff, rel, bound["forward" if name == "output" else "gradient"]))
    del got, want

    result.times["kernel_fwd"] = _timed(jax.jit(case.kernel), inputs, reps)
    result.times["kernel_fwd_bwd"] = _timed(kernel_grads, (*inputs, cotangent), reps)
    result.times["xla_fwd"] = _timed(jax.jit(case.reference), inputs, reps)
    result.times["xla_fwd_bwd"] = _timed(jax.jit(_with_gradients(case.reference, n_float)), (*inputs, cotangent), reps)
    return result


def format_result(result: Result, case: Case, peak: float) -> str:
    """One case's lines of the table: errors with bounds, times, ratios and TFLOP/s."""
    lines = [f"## {result.name}  [{result.shape}]  {'PASS' if result.passed else 'FAIL'}"]
    if result.failure:
        lines.append("  " + result.failure.replace("\n", "\n  "))
    for name, diff, rel, bound in result.errors:
        lines.append(f"  {name:8s} max abs err {diff:.3e}  rel {rel:.3e}  bound {bound:.0e}")
    t = result.times
    for phase, flops in (("fwd", case.forward_flops), ("fwd_bwd", case.forward_flops + case.backward_flops)):
        kernel, xla = t.get(f"kernel_{phase}"), t.get(f"xla_{phase}")
        if kernel is None or xla is None:
            continue
        rate = flops / kernel / 1e12
        lines.append(
            f"  {phase:8s} kernel {kernel * 1e3:9.3f} ms  xla {xla * 1e3:9.3f} ms  xla/kernel {xla / kernel:6.2f}x  "
            f"kernel {rate:7.1f} TFLOP/s ({100 * rate * 1e12 / peak:5.1f}% of peak)  "
            f"xla {flops / xla / 1e12:7.1f} TFLOP/s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
    """Run the cases, print the table (and write it to ``--out``); the results, for tests."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interpret", action="store_true", help="Pallas interpret mode (a CPU)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (for interpret mode)")
    parser.add_argument("--reps", type=int, default=10, help="timed calls per measurement (median)")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(BOUNDS))
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--gmm-tiling", default="", help="rows,in,out tiles of the grouped matmul")
    parser.add_argument("--out", default="", help="also write the table to this file")
    args = parser.parse_args(argv)

    import jax

    mods = torch_free_modules()
    device = jax.devices()[0]
    chip = mods["chips"].CHIPS["v5e"]
    header = [
        f"# titanpod Pallas kernels vs XLA: {device.platform} {device.device_kind}, jax {jax.__version__}, "
        f"{'interpret' if args.interpret else 'Mosaic'}, {args.dtype}, median of {args.reps}",
        f"# peak: {chip.name} dense bf16 {chip.peak_flops / 1e12:.0f} TFLOP/s (titanpod.device.chips)",
    ]
    lines = list(header)
    print("\n".join(header), flush=True)
    cases = build_cases(mods, args.tiny, args.interpret, args.dtype, args.gmm_tiling)
    wanted = {name for name in args.only.split(",") if name}
    results = []
    for case in cases:
        if wanted and case.name not in wanted:
            continue
        try:
            result = run_case(case, args.reps, args.dtype)
        except Exception as exc:  # a kernel that fails to compile or run is a finding: report it, go on
            result = Result(case.name, case.shape, failure=f"{type(exc).__name__}: {exc}"[:4000])
            traceback.print_exc()
        results.append(result)
        text = format_result(result, case, chip.peak_flops)
        lines.append(text)
        print(text, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return results


if __name__ == "__main__":
    sys.exit(0 if all(result.passed for result in main()) else 1)
