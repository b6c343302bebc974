"""Memory of one whole training step under each activation memory policy.

    uv run python tools/bench/memory_policies.py [--policies save,selective,recompute] [--seq 1024]

The model is a narrow, deep Llama 3 shape (dim 512, 8 layers, 8 heads, 4 kv heads, ffn
1536, vocabulary 8,192; about 34M parameters) on batch 4 x ``--seq`` tokens, so that
activations outweigh parameters, gradients and optimizer state. Two figures per policy,
each from a fresh process:

- graph peak: the largest number of bytes the captured step's intermediate values hold at
  once, running the rewritten graph op by op (exact for the graph as written);
- process peak: how far the process's resident memory rises above where it stood just
  before one compiled (inductor) step, its peak window reset there (Linux ``clear_refs``);
  parameters and optimizer state are allocated before, so this is what the step adds.
  Memory the compiling step freed can stay resident in the allocator and be reused
  without raising the figure, so it undercounts; the graph peak is the exact one.

Also printed: step time of the compiled step (after compilation) and the ratio of each
figure to ``save``'s, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ARGS = {"dim": 512, "n_layers": 8, "n_heads": 8, "n_kv_heads": 4, "vocab_size": 8192, "ffn_dim": 1536}


def _one(policy: str, seq: int, batch: int) -> dict:
    import torch

    from titanpod.device import get_backend
    from titanpod.device.memory import host_memory_stats
    from titanpod.graph import TrainConfig, WholeStep
    from titanpod.graph.graph_memory import peak_intermediate_bytes
    from titanpod.models import DecoderArgs, Transformer, parameter_count

    model = Transformer(DecoderArgs(**ARGS, max_seq_len=seq))
    model.init_weights(0)
    backend = get_backend("cpu")
    tokens = torch.randint(0, ARGS["vocab_size"], (1, batch, seq), generator=torch.Generator().manual_seed(0))
    batches = [(tokens[0], tokens[0])]

    as_graph = WholeStep(model, TrainConfig(step_mode="whole_step", memory_policy=policy, compiler="none"), backend)
    graph = as_graph.prepare(tokens, tokens)
    plan = graph.meta["activation_plan"]
    graph_peak = peak_intermediate_bytes(graph, *as_graph._inputs(tokens, tokens, as_graph.lr_tensor(1e-4)))
    del as_graph, graph

    compiled = WholeStep(model, TrainConfig(step_mode="whole_step", memory_policy=policy), backend)
    compiled(batches, 1e-4)  # compiles; its own peak is not counted below
    backend.reset_peak_memory()  # drop the compiler's own peak
    before = host_memory_stats().current_bytes
    start = time.perf_counter()
    compiled(batches, 1e-4)
    seconds = time.perf_counter() - start
    process_peak = host_memory_stats().peak_bytes
    return {
        "policy": policy,
        "parameters": parameter_count(model),
        "saved_bytes": plan.saved_bytes,
        "graph_peak": graph_peak,
        "process_growth": max(process_peak - before, 0),
        "step_seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="save,selective,recompute")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.seq, args.batch)))
        return
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    rows = []
    for policy in args.policies.split(","):
        command = [sys.executable, __file__, "--one", policy, "--seq", str(args.seq), "--batch", str(args.batch)]
        run = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if run.returncode != 0:
            print(f"{policy}: failed\n{run.stderr[-2000:]}")
            continue
        rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
    if not rows:
        return
    base = rows[0]
    mib = 1024**2
    print(f"model: {base['parameters'] / 1e6:.1f}M parameters, batch {args.batch} x {args.seq} tokens")
    print(f"{'policy':10s} {'saved':>10s} {'graph peak':>11s} {'ratio':>6s} {'process +':>10s} {'ratio':>6s} "
          f"{'step':>7s} {'ratio':>6s}")  # fmt: skip
    for row in rows:
        print(
            f"{row['policy']:10s} {row['saved_bytes'] / mib:8.0f}MiB {row['graph_peak'] / mib:9.0f}MiB "
            f"{row['graph_peak'] / base['graph_peak']:6.2f} {row['process_growth'] / mib:8.0f}MiB "
            f"{row['process_growth'] / max(base['process_growth'], 1):6.2f} {row['step_seconds']:6.2f}s "
            f"{row['step_seconds'] / base['step_seconds']:6.2f}"
        )
    print(f"ratios are against {base['policy']}, measured in this run; 'process +' is peak RSS growth over one step.")


if __name__ == "__main__":
    main()
