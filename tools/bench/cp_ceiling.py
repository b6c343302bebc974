"""The sequence-length ceiling per rank at a fixed memory budget, with and without context parallelism.

    uv run python tools/bench/cp_ceiling.py [--seq-lens 1024,2048,4096,8192] [--budget-mib 1024] [--cp 1,2]

For each cp degree and sequence length, a fresh torchrun launch of ``cp`` processes (gloo, one OpenMP
thread each; one process for cp 1) builds the Llama 3 debug model (whole on every rank: fsdp 1, so only
the sequence is split) and trains one warm-up step and one measured step on a batch of one row of that
length, eager (the warm-up on a short row, so the optimizer state exists and the high-water mark stays
low). Each rank's peak resident memory (``ru_maxrss``, so every point is its own process) above its
resident memory just before the measured step is what that length costs it;
the largest such figure over the ranks is the point's cost. Printed: the cost of each length for each
degree, the ratio cp1 / cpN at each length, and the ceiling: the longest length measured whose cost
stays within ``--budget-mib``, and the ratio of the ceilings.

What the cost holds: activations kept for backward (each rank keeps its 2 chunks of the row, plus every
layer's gathered keys and values), the attention mask of SDPA (a boolean [s, S] per rank under cp, none
without: CPU SDPA is causal by flag there) and working memory.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

MiB = 2**20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _resident_bytes() -> int:
    """This process's resident memory now."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(seq_len: int, out: Path) -> None:
    """One point, in this process (under torchrun for cp > 1): the step's peak memory above its start."""
    import resource

    import torch
    import torch.distributed as dist

    from titanpod.device import get_backend
    from titanpod.graph import TrainConfig, build_step
    from titanpod.parallel import ParallelConfig
    from titanpod.parallel.torch_executor import parallelize
    from titanpod.recipes.families import build_model, sharding_plan

    backend = get_backend("cpu")
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(0)
    cp = int(os.environ.get("WORLD_SIZE", "1"))
    if cp > 1:
        parallelize(model, sharding_plan("llama3"), ParallelConfig(fsdp=1, cp=cp), backend)
    step = build_step(model, TrainConfig(steps=2, warmup_steps=1, log_every=2), backend)
    generator = torch.Generator().manual_seed(0)

    def batch(length: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = torch.randint(0, model.args.vocab_size, (1, length + 1), generator=generator)
        return row[:, :-1], row[:, 1:]

    step([batch(64)], 1e-4)  # warm-up on a short row: the optimizer state exists, the high-water mark stays low
    before = _resident_bytes()
    loss = step([batch(seq_len)], 1e-4).loss.item()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cost = torch.tensor([after - before], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(cost, op=dist.ReduceOp.MAX)
        # each cp rank's loss is its weighted share of the row's; their mean is the row's loss
        shares = torch.tensor([loss], dtype=torch.float64)
        dist.all_reduce(shares)
        loss = shares.item() / dist.get_world_size()
    if not dist.is_initialized() or dist.get_rank() == 0:
        out.write_text(json.dumps({"seq_len": seq_len, "cp": cp, "bytes": int(cost.item()), "loss": loss}))
    if dist.is_initialized():
        dist.destroy_process_group()


def measure(cp: int, seq_len: int) -> dict:
    """Run one point in fresh processes and return what it wrote."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "point.json"
        launcher = [sys.executable]
        if cp > 1:
            launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(cp),
                         "--master-addr", "127.0.0.1", "--master-port", str(_free_port())]  # fmt: skip
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
        command = [*launcher, __file__, "--worker", "--seq-lens", str(seq_len), "--out", str(out)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
        if result.returncode != 0:
            return {"seq_len": seq_len, "cp": cp, "error": result.stderr.strip().splitlines()[-1:]}
        return json.loads(out.read_text())


def ceiling_table(seq_lens: list[int], cps: list[int], budget_mib: float) -> list[str]:
    """Measure every point and return the printed table's lines (also printed as they come)."""
    costs: dict[tuple[int, int], float] = {}
    for seq_len in seq_lens:
        for cp in cps:
            point = measure(cp, seq_len)
            if "error" in point:
                print(f"  cp {cp}, {seq_len} tokens: failed ({point['error']})", flush=True)
                continue
            costs[cp, seq_len] = point["bytes"] / MiB
            print(
                f"  cp {cp}, {seq_len:,} tokens: {costs[cp, seq_len]:,.0f} MiB (loss {point['loss']:.4f})", flush=True
            )
    base = cps[0]
    header = "| tokens per row | " + " | ".join(f"cp {cp} (MiB per rank)" for cp in cps)
    header += "".join(f" | cp {base} / cp {cp}" for cp in cps[1:]) + " |"
    lines = [header, "|" + " --- |" * (header.count("|") - 1)]
    for seq_len in seq_lens:
        cells = [f"{costs[cp, seq_len]:,.0f}" if (cp, seq_len) in costs else "-" for cp in cps]
        ratios = []
        for cp in cps[1:]:
            both = (base, seq_len) in costs and (cp, seq_len) in costs
            ratios.append(f"{costs[base, seq_len] / costs[cp, seq_len]:.2f}" if both else "-")
        lines.append(f"| {seq_len:,} | " + " | ".join(cells + ratios) + " |")
    ceilings = {}
    for cp in cps:
        fitting = [s for s in seq_lens if (cp, s) in costs and costs[cp, s] <= budget_mib]
        ceilings[cp] = max(fitting) if fitting else 0
    lines.append("")
    text = ", ".join(f"cp {cp}: {ceilings[cp]:,} tokens" for cp in cps)
    lines.append(f"Longest row measured within {budget_mib:,.0f} MiB per rank: {text}")
    for cp in cps[1:]:
        if ceilings[base]:
            lines.append(f"ceiling ratio cp {cp} / cp {base}: {ceilings[cp] / ceilings[base]:.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="1024,2048,4096,8192", help="comma-separated row lengths")
    parser.add_argument("--cp", default="1,2", help="comma-separated cp degrees; the first is the baseline")
    parser.add_argument("--budget-mib", type=float, default=1024.0, help="memory per rank for the ceiling")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    if args.worker:
        worker(seq_lens[0], args.out)
        return
    cps = [int(c) for c in args.cp.split(",")]
    print(f"sequence-length ceiling: llama3 debug, one row, eager, fp32; cp degrees {cps}", flush=True)
    print("\n".join(ceiling_table(seq_lens, cps, args.budget_mib)))


if __name__ == "__main__":
    main()
