"""Peak memory and time of the chunked output projection + cross-entropy against the reference.

    uv run python tools/bench/kernels.py [--tokens 8192] [--dim 2048] [--vocab 128256] [--chunk-rows 0]

Each implementation runs forward and backward once in a fresh process (after one
small warm-up call), fp32 on the CPU; reported: wall time and the growth of the
process's peak resident memory over its inputs, and the ratios chunked / reference.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _phase(kind: str, tokens: int, dim: int, vocab: int, chunk_rows: int | None) -> None:
    import torch

    from titanpod.kernels import chunked_linear_cross_entropy
    from titanpod.models import linear_cross_entropy

    def loss_fn(h, w, labels):
        if kind == "chunked":
            return chunked_linear_cross_entropy(h, w, labels, chunk_rows=chunk_rows)
        return linear_cross_entropy(h, w, labels)

    g = torch.Generator().manual_seed(0)
    small = [torch.randn(1, 4, 8, generator=g, requires_grad=True), torch.randn(16, 8, requires_grad=True)]
    loss_fn(*small, torch.randint(0, 16, (1, 4))).backward()  # warm up kernels and allocator paths
    h = (torch.randn(1, tokens, dim, generator=g) * 0.02).requires_grad_()
    w = (torch.randn(vocab, dim, generator=g) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (1, tokens), generator=g)
    before = _peak_bytes()
    start = time.perf_counter()
    loss = loss_fn(h, w, labels)
    loss.backward()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "extra_peak_bytes": _peak_bytes() - before, "loss": loss.item()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--chunk-rows", type=int, default=0, help="0: the default 256 MiB of logits per chunk")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    chunk_rows = args.chunk_rows or None
    if args.phase:
        _phase(args.phase, args.tokens, args.dim, args.vocab, chunk_rows)
        return
    shape = ["--tokens", str(args.tokens), "--dim", str(args.dim), "--vocab", str(args.vocab),
             "--chunk-rows", str(args.chunk_rows)]  # fmt: skip
    print(f"tokens={args.tokens} dim={args.dim} vocab={args.vocab}, fp32, forward + backward on the CPU")
    results = {}
    for kind in ("reference", "chunked"):
        out = subprocess.run([sys.executable, __file__, "--phase", kind, *shape], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{kind} failed:\n{out.stderr[-2000:]}")
        results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[kind]
        peak_gib = r["extra_peak_bytes"] / 1024**3
        print(f"{kind:9s} {r['seconds']:7.2f} s   peak memory above inputs {peak_gib:6.2f} GiB   loss {r['loss']:.6f}")
    ref, chunked = results["reference"], results["chunked"]
    print(f"chunked / reference: time {chunked['seconds'] / ref['seconds']:.2f}x, "
          f"peak memory {chunked['extra_peak_bytes'] / ref['extra_peak_bytes']:.3f}x "
          f"({ref['extra_peak_bytes'] / max(chunked['extra_peak_bytes'], 1):.1f} times less)")  # fmt: skip


if __name__ == "__main__":
    main()
