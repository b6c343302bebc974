"""Time of the C++ CPU flash attention (``kernels.attention cpu_flash``) against PyTorch's SDPA.

    uv run python tools/bench/cpu_attention.py [--batch 4] [--heads 16] [--seq 512] [--head-dims 16,32,64,128]
        [--dtype float32] [--repeats 10]

Per head dim: causal attention on [batch, heads, seq, head_dim] inputs laid out as a model
makes them (projected as [batch, seq, heads, head_dim], then transposed), forward alone and
forward + backward, each the median of ``--repeats`` calls after two warm-up calls, the two ops
alternating call by call so that drift in the machine's speed hits both alike. Prints
milliseconds and the ratio SDPA / kernel (above 1: the kernel is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--head-dims", default="16,32,64,128")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    import torch

    from titanpod.kernels import CpuFlashAttention
    from titanpod.models import sdpa_attention

    dtype = getattr(torch, args.dtype)
    kernel = CpuFlashAttention()
    print(f"causal attention, batch {args.batch}, {args.heads} heads, seq {args.seq}, {args.dtype}, "
          f"{torch.get_num_threads()} threads; median of {args.repeats} calls")  # fmt: skip
    print("| head dim | SDPA fwd (ms) | kernel fwd (ms) | ratio | SDPA fwd+bwd (ms) | kernel fwd+bwd (ms) | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for head_dim in (int(d) for d in args.head_dims.split(",")):
        g = torch.Generator().manual_seed(0)
        shape = (args.batch, args.seq, args.heads, head_dim)
        q, k, v = (torch.randn(shape, generator=g, dtype=dtype).transpose(1, 2).requires_grad_() for _ in range(3))
        grad = torch.randn(args.batch, args.heads, args.seq, head_dim, generator=g, dtype=dtype)

        def forward(op, q, k, v, grad):
            with torch.no_grad():
                op(q, k, v)

        def forward_backward(op, q, k, v, grad):
            op(q, k, v).backward(grad)

        row = [str(head_dim)]
        for run in (forward, forward_backward):
            times: dict[str, list[float]] = {"sdpa": [], "kernel": []}
            for i in range(args.repeats + 2):
                for name, op in (("sdpa", sdpa_attention), ("kernel", kernel)):
                    start = time.perf_counter()
                    run(op, q, k, v, grad)
                    if i >= 2:
                        times[name].append(time.perf_counter() - start)
            sdpa, ours = (statistics.median(times[name]) * 1e3 for name in ("sdpa", "kernel"))
            row += [f"{sdpa:.1f}", f"{ours:.1f}", f"{sdpa / ours:.2f}"]
        print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
